"""``ioattn bench mods``: programmable attention's speed beside FlexAttention and the built-in forms.

For each mask or score kind (FlexAttention's own library: causal, sliding window, prefix-LM,
document masking over packed sequences, ALiBi, softcap; and a random block-sparse layout), head dim
and sequence length, forward and forward+backward device time of:

* ``ioattn``: ``flash_attn_func`` with the kind's ``mask_mod`` / ``score_mod`` and its block mask
  (built once, outside the timed calls, as a model would), the functions as a user writes them
  (``_as_user``: the library's own would run as their built-in forms), so the generated code is timed;
  on sm_90 its forward is the Gluon ping-pong kernel;
* ``ioattn-portable``: the same on the portable kernels (``hopper.prefer_hopper(False)``);
* ``ioattn-portable-bwd``: the same with the backward on the portable kernels
  (``hopper_bwd.prefer_hopper_bwd(False)``): the A/B of the Gluon backward with mask functions;
* ``ioattn-builtin``: the same attention through the built-in arguments where there are some
  (``causal``, ``window_size``, ``softcap``, ``alibi_slopes``, the varlen call for documents; dense
  attention for the block-sparse layout, the 10x-ideal's baseline);
* ``flex``: ``torch.compile``d FlexAttention with the same functions and its own block mask;
* ``sdpa-cudnn``: where cuDNN takes the mask (causal).

Every provider is checked once per configuration against the float64 oracle on one head of the
problem. And the block mask's own cost (``--build-seqlen``): building a document-causal block mask of
that length with ``create_block_mask`` and FlexAttention's, synchronised wall time (``sweep`` =
``mods-build``, in ``--out``'s ``build.jsonl``). The timed records (``results.jsonl``) carry ``sweep`` =
``mods-<kind>``; ``ioattn bench report`` reads them.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import statistics

import torch

from ioattn.bench.arg_types import int_list, non_negative_int

NAME = "mods"
HELP = ("mask and score functions (FlexAttention's library, a 90%-sparse block mask): ioattn beside "
        "FlexAttention, the built-in forms and cuDNN, forward and forward+backward")
KINDS = ("causal", "sliding_window", "prefix_lm", "document", "alibi", "softcap", "block_sparse")
WINDOW, PREFIX, CAP, SPARSITY, BLOCK = 1024, 1024, 30.0, 0.9, 128
TOKENS, HIDDEN = 16384, 2048  # batch * seqlen, nheads * headdim, as the training sweeps


def add_arguments(parser):
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated kinds (default: all: "
                        f"{', '.join(KINDS)})")
    parser.add_argument("--headdims", type=int_list(1), default=(64, 128), help="head dims (default: 64,128)")
    parser.add_argument("--seqlens", type=int_list(1), default=(1024, 4096, 16384),
                        help="sequence lengths (default: 1024,4096,16384)")
    parser.add_argument("--modes", default="fwd,fwdbwd", help="fwd and / or fwdbwd (default: both)")
    parser.add_argument("--providers", default="ioattn,ioattn-portable,ioattn-builtin,flex,sdpa-cudnn",
                        help="comma-separated (default: ioattn,ioattn-portable,ioattn-builtin,flex,sdpa-cudnn)")
    parser.add_argument("--build-seqlen", type=non_negative_int, default=131072,
                        help="the block-mask build's length (default: 131072; 0: not timed)")
    parser.add_argument("--out", default=None,
                        help="folder for results.jsonl and build.jsonl (default: none, printed only)")
    return parser


def _kind(kind, n, nheads, batch, device):
    """(mask_mod, score_mod, builtin kwargs or None (dense for the sparse kind), varlen documents or None)."""
    from ioattn import mods as M

    if kind == "causal":
        return M.causal_mask, None, dict(causal=True), None
    if kind == "sliding_window":
        return M.sliding_window(WINDOW, 0), None, dict(window_size=(WINDOW, 0)), None
    if kind == "prefix_lm":
        return M.prefix_lm(PREFIX), None, None, None
    if kind == "document":
        g = torch.Generator().manual_seed(n)
        lengths = _document_lengths(n, g)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
        docs = M.document_ids(cu)  # one row's documents; every batch entry packs the same lengths
        cu_all = torch.tensor([0, *torch.tensor(lengths * batch).cumsum(0).tolist()], dtype=torch.int32,
                              device=device)
        return M.document_mask(docs, M.causal_mask), None, dict(causal=True), (cu_all, max(lengths))
    if kind == "alibi":
        slopes = torch.tensor([2 ** (-8 * (h + 1) / nheads) for h in range(nheads)], device=device)
        return M.causal_mask, M.alibi(slopes), dict(causal=True, alibi_slopes=slopes), None
    if kind == "softcap":
        return M.causal_mask, M.softcap(CAP), dict(causal=True, softcap=CAP), None
    if kind == "block_sparse":
        return None, None, {}, None
    raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")


def _document_lengths(n, g):
    """Packed documents of 1/8 to 1/2 of the sequence, the last one the remainder."""
    lengths, left = [], n
    while left > 0:
        take = min(left, int(torch.randint(n // 8, n // 2 + 1, (1,), generator=g)))
        lengths.append(take)
        left -= take
    return lengths


def _block_mask(kind, mask_mod, n, batch, nheads, device):
    from ioattn.block_mask import block_sparse_mask, create_block_mask

    if kind == "block_sparse":
        g = torch.Generator().manual_seed(n)
        nb = -(-n // BLOCK)
        layout = torch.rand(nheads, nb, nb, generator=g) >= SPARSITY
        layout |= torch.eye(nb, dtype=torch.bool)  # no empty query block
        return block_sparse_mask(layout.to(device), n, n, BLOCK), layout
    return create_block_mask(mask_mod, None, None, n, n, device=device, BLOCK_SIZE=BLOCK), None


def _as_user(fn):
    """``fn`` as a user writes it: the same function without the library's built-in form (None stays None)."""
    if fn is None:
        return None

    def user_fn(*args):
        return fn(*args)
    user_fn.__name__ = getattr(fn, "__name__", "user_fn")
    return user_fn


def _providers(kind, names, n, batch, nheads, device):
    import ioattn
    from ioattn.plan import hopper

    mask_mod, score_mod, builtin, docs = _kind(kind, n, nheads, batch, device)
    bm, layout = _block_mask(kind, _as_user(mask_mod), n, batch, nheads, device)
    user_score = _as_user(score_mod)
    out = {}
    if "ioattn" in names:
        out["ioattn"] = lambda q, k, v: ioattn.flash_attn_func(q, k, v, score_mod=user_score, block_mask=bm)
    if "ioattn-portable" in names:
        def portable(q, k, v):
            with hopper.prefer_hopper(False):
                return ioattn.flash_attn_func(q, k, v, score_mod=user_score, block_mask=bm)
        out["ioattn-portable"] = portable
    if "ioattn-portable-bwd" in names:  # the A/B of the Gluon backward with mask functions
        from ioattn.plan import hopper_bwd

        def portable_bwd(q, k, v):
            return ioattn.flash_attn_func(q, k, v, score_mod=user_score, block_mask=bm)
        portable_bwd.context = lambda: hopper_bwd.prefer_hopper_bwd(False)  # around the backward too (``_time``)
        out["ioattn-portable-bwd"] = portable_bwd
    if "ioattn-builtin" in names and builtin is not None:
        if docs is not None:
            cu, longest = docs

            def varlen(q, k, v):
                packed = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
                return ioattn.flash_attn_varlen_func(*packed, cu, cu, longest, longest, **builtin).view_as(q)
            out["ioattn-builtin"] = varlen
        else:
            out["ioattn-builtin"] = lambda q, k, v: ioattn.flash_attn_func(q, k, v, **builtin)
    if "flex" in names:
        out["flex"] = _flex(kind, mask_mod, score_mod, layout, n, device)
    if "sdpa-cudnn" in names and kind == "causal":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def cudnn(q, k, v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
        out["sdpa-cudnn"] = cudnn
    return out, dict(mask_mod=mask_mod if layout is None else _layout_mask(layout), score_mod=score_mod)


def _layout_mask(layout):
    def block_sparse(b, h, q_idx, kv_idx):
        return layout.to(q_idx.device)[h, q_idx // BLOCK, kv_idx // BLOCK]
    return block_sparse


def _flex(kind, mask_mod, score_mod, layout, n, device):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # a fresh compile a point: past dynamo's recompile limit FlexAttention falls back to its unfused
    # eager form (the dense scores: slow, then out of memory)
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)
    if layout is not None:  # FlexAttention's block-sparse form: the layout's blocks as full blocks, no mask
        bm = _flex_layout_mask(layout.to(device), n)
    else:
        bm = create_block_mask(mask_mod, None, None, n, n, device=device, BLOCK_SIZE=BLOCK)

    def run(q, k, v):
        return compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), score_mod=score_mod,
                        block_mask=bm).transpose(1, 2)
    return run


def _flex_layout_mask(layout, n):
    """FlexAttention's ``BlockMask`` of a (heads, blocks, blocks) layout, made from its block lists
    (``BlockMask.from_kv_blocks``) rather than by evaluating a mask function over every (query, key)
    pair, which needs the dense N x N mask in memory."""
    from torch.nn.attention.flex_attention import BlockMask

    lay = layout[None]
    full_num = lay.sum(-1, dtype=torch.int32)
    full_idx = torch.argsort((~lay).to(torch.int8), dim=-1, stable=True).to(torch.int32)  # listed blocks first
    return BlockMask.from_kv_blocks(torch.zeros_like(full_num), torch.zeros_like(full_idx), full_num, full_idx,
                                    BLOCK_SIZE=BLOCK, seq_lengths=(n, n))


def _check(fn, q, k, v, refs):
    """max error on the problem's first batch entry and head vs the float64 oracle, and PyTorch's own in
    the same dtype: ok when within twice it (plus 1e-3)."""
    from ioattn.reference.naive import attention_ref

    qs, ks, vs = (t[:1, :, :1].contiguous() for t in (q, k, v))
    with torch.no_grad():
        out = fn(q, k, v)[:1, :, :1]
        ref64, _ = attention_ref(qs, ks, vs, **refs)
        ref_t, _ = attention_ref(qs, ks, vs, upcast=False, **refs)
    err = (out.double() - ref64).abs().max().item()
    base = (ref_t.double() - ref64).abs().max().item()
    return err <= 2 * base + 1e-3, err


def _time(fn, q, k, v, mode):
    """Device ms of ``fn``'s forward or forward + backward; ``fn.context`` (where a provider has one): a
    context manager around the whole timed call, backward included."""
    from ioattn.bench.timing import median_ms

    with getattr(fn, "context", contextlib.nullcontext)():
        if mode == "fwd":
            with torch.no_grad():
                return median_ms(lambda s: fn(*s), [(q, k, v)])
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        dout = torch.randn_like(q)
        return median_ms(lambda s: torch.autograd.grad(fn(*s), s, dout), [leaves])


def _flops(batch, nheads, n, d, density, mode):
    fwd = 4.0 * batch * nheads * n * n * d * density
    return fwd * (3.5 if mode == "fwdbwd" else 1.0)


def run(args):
    """``ioattn bench mods``: exit status 0 when every ioattn record is correct."""
    if not torch.cuda.is_available():
        print("ioattn bench mods needs a GPU (FlexAttention and the timings are device-side)")
        return 1
    from ioattn.bench.run import environment

    env = environment()
    kinds = [k for k in args.kinds.split(",") if k]
    names = [p for p in args.providers.split(",") if p]
    modes = [m for m in args.modes.split(",") if m]
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    sink = open(os.path.join(args.out, "results.jsonl"), "w") if args.out else None
    records = []
    try:
        for kind in kinds:
            for d in args.headdims:
                for n in args.seqlens:
                    records += _point(kind, d, n, names, modes, env, sink, "ioattn " + " ".join(args.argv))
    finally:
        if sink:
            sink.close()
    if args.build_seqlen:  # the block-mask builds: their own file (not attention records)
        builds = build_times(args.build_seqlen, "cuda", "flex" in names)
        for rec in builds:
            rec.update(device=env["device"], command="ioattn " + " ".join(args.argv))
            print(f"block mask build n={rec['seqlen_q']} {rec['provider']:8s} {rec['ms']:8.2f} ms", flush=True)
        if args.out:
            with open(os.path.join(args.out, "build.jsonl"), "w") as f:
                f.writelines(json.dumps(rec) + "\n" for rec in builds)
    _summary(records)
    ours = [r for r in records if r["provider"] == "ioattn"]
    return 0 if ours and all(r["ok"] for r in ours) else 1


def _point(kind, d, n, names, modes, env, sink, command):
    device = "cuda"
    nheads, batch = HIDDEN // d, max(1, TOKENS // n)
    g = torch.Generator(device=device).manual_seed(n + d)
    q, k, v = (torch.randn(batch, n, nheads, d, device=device, dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    fns, refs = _providers(kind, names, n, batch, nheads, device)
    density = _density(kind, n, refs, device)
    out = []
    for pname, fn in fns.items():
        base = dict(sweep=f"mods-{kind}", provider=pname, dtype="bf16", batch=batch, nheads=nheads,
                    nheads_kv=nheads, headdim=d, seqlen_q=n, seqlen_k=n, causal=kind != "block_sparse" and
                    kind not in ("prefix_lm",), paged=False, device=env["device"], density=density, command=command,
                    env=env)
        try:
            ok, err = _check(fn, q, k, v, refs) if pname != "ioattn-builtin" or kind != "block_sparse" else (True, 0)
            for mode in modes:
                ms = statistics.median(_time(fn, q, k, v, mode) for _ in range(3))
                rec = dict(base, mode=mode, ms=ms, tflops=_flops(batch, nheads, n, d, density, mode) / ms / 1e9,
                           ok=ok, max_err=err)
                out.append(rec)
                print(f"{kind:14s} d={d:3d} n={n:6d} {mode:6s} {pname:15s} {ms:8.3f} ms  "
                      f"{rec['tflops']:6.1f} TFLOP/s  {'ok' if ok else 'WRONG'} (err {err:.1e})", flush=True)
        except Exception as e:  # noqa: BLE001 - a provider that cannot run a point is reported, not fatal
            out.append(_failed(base, modes[0], e))
            print(f"{kind:14s} d={d:3d} n={n:6d} {pname:15s} cannot run: {type(e).__name__}: {str(e)[:120]}")
        torch.cuda.empty_cache()
    if sink:
        for r in out:
            sink.write(json.dumps(r) + "\n")
        sink.flush()
    return out


def _failed(base, mode, error):
    """The record of a provider that cannot run a point: no time, the error's type and text."""
    return dict(base, mode=mode, ms=None, tflops=None, ok=False, error=f"{type(error).__name__}: {str(error)[:200]}")


def build_times(n, device, flex=True, reps=5):
    """Records of building a document-causal block mask over ``n`` tokens (documents of 1/8 to 1/2 of
    it) by ``ioattn.create_block_mask`` and, with ``flex``, FlexAttention's: median synchronised wall
    time of ``reps`` builds after one warm-up, in ms."""
    import time

    from ioattn import mods as M
    from ioattn.block_mask import create_block_mask

    lengths = _document_lengths(n, torch.Generator().manual_seed(n))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    docs = M.document_ids(cu)
    builders = {"ioattn": lambda: create_block_mask(M.document_mask(docs, M.causal_mask), None, None, n, n,
                                                    device=device, BLOCK_SIZE=BLOCK)}
    if flex:
        from torch.nn.attention.flex_attention import create_block_mask as flex_block_mask

        def doc_causal(b, h, q_idx, kv_idx):
            return (docs[q_idx] == docs[kv_idx]) & (q_idx >= kv_idx)
        # compiled, as FlexAttention advises for long sequences (eager evaluation holds the dense N x N mask)
        builders["flex"] = lambda: flex_block_mask(doc_causal, None, None, n, n, device=device, BLOCK_SIZE=BLOCK,
                                                   _compile=True)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    out = []
    for name, build in builders.items():
        build()
        times = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            build()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        out.append(dict(sweep="mods-build", provider=name, seqlen_q=n, seqlen_k=n, mode="build",
                        ms=statistics.median(times), ok=True, block=BLOCK))
    return out


def _density(kind, n, refs, device):
    """The fraction of (query, key) pairs computed (what the TFLOP/s count), on 256 sampled rows."""
    mask = refs["mask_mod"]
    if mask is None:
        return 1.0
    i32 = torch.int32
    zero = torch.zeros(1, 1, dtype=i32, device=device)
    rows = torch.linspace(0, n - 1, 256, device=device).to(i32).view(-1, 1)
    cols = torch.arange(n, device=device, dtype=i32).view(1, -1)
    return float(mask(zero, zero, rows, cols).expand(256, n).float().mean())


def _summary(records):
    """Per kind, head dim and mode: ioattn's time against each peer's (ratio > 1: ioattn faster)."""
    by = {}
    for r in records:
        if r.get("ms"):
            by.setdefault((r["sweep"], r["headdim"], r["seqlen_q"], r["mode"]), {})[r["provider"]] = r["ms"]
    print()
    for key, cell in sorted(by.items()):
        if "ioattn" not in cell:
            continue
        parts = [f"{p} {cell[p] / cell['ioattn']:.2f}x" for p in cell if p != "ioattn"]
        print(f"{key[0]:20s} d={key[1]:3d} n={key[2]:6d} {key[3]:6s} ioattn {cell['ioattn']:.3f} ms; "
              + ", ".join(parts) + (" (peer time / ioattn time)" if parts else ""))
    if not math.isfinite(sum(r.get("ms") or 0 for r in records)):
        print("non-finite times")
