"""A/B of attention with a sliding window (flash-attn's ``window_size=(left, right)``): the Gluon
Hopper kernels' WINDOW forms against the portable Triton kernels, with FlexAttention (a block mask
of the same band, ``torch.compile``d) measured in the same run as the peer where asked for.
``--pass bwd`` (the default): the backward, Gluon by ``hopper_bwd.prefer_hopper_bwd(True)``, portable by
``(False)``; ``--pass fwd``: the forward, by ``hopper.prefer_hopper(True / False)``.

    python benchmarks/ab_window.py --out DIR [--pass bwd|fwd] [--headdims 64,128,256]
                                   [--seqlens 4096,16384] [--windows 256:0,1024:0,4096:0]
                                   [--providers gluon,portable,flex] [--flex-headdims 128] [--softcap 50]
                                   [--alibi]

``--softcap CAP``: every provider with the score softcap cap * tanh(s / cap) (flash-attn's ``softcap``;
FlexAttention's as a score_mod); a window -1:-1 is no window, -1:0 the causal mask. ``--alibi``:
every provider with ALiBi (flash-attn's ``alibi_slopes``, the paper's slopes 2^(-8 (h + 1) / H) by
head; FlexAttention's as a score_mod). Provider ``gluon-cs`` (the backward with a softcap): the Gluon
backward's column-split form at d = 128 too (``hopper_bwd.WS_SOFTCAP_COL_SPLIT_HEADDIMS``, in
this process), against ``gluon``, the default. Provider ``gluon-was`` (the forward with ALiBi): the
ALiBi configuration of docs/decisions/alibi.md's first form (``alibi_forms``: the fp32 columns everywhere, d = 128 at 64-key
tiles, d = 64 in pingpong); ``gluon-magic``: the magic form for causal calls at any length and for
windows.

bf16, 16384 tokens (batch = 16384 / N), hidden 2048 (heads = 2048 / d), as ``ioattn bench train``.
The backward alone is timed (``torch.autograd.grad`` of a forward kept alive, ``retain_graph``; the
switch in force at the forward governs its backward); the forward alone without autograd;
``ioattn.bench.timing.median_ms`` (device time, median of 20). FLOPs: the forward's 4 * B * H * D *
(the band's visible (query, key) pairs), 2.5 x that for the backward. Each provider's gradients (or
output) are checked finite and within 0.05 of the portable ones (a smoke check: the float64 oracle
is the GPU tests' job). FlexAttention compiles once a shape and window (tens of seconds), so by
default it runs at head dim 128 only (``--flex-headdims``). Writes DIR/ab_window.jsonl (backward) or
DIR/ab_window_fwd.jsonl (forward).
"""
import argparse
import json
import os

import torch

import ioattn
from ioattn.plan import hopper
from ioattn.plan import hopper_bwd
from ioattn.bench.timing import median_ms

TOKENS, HIDDEN = 16384, 2048


def visible_pairs(n, left, right):
    """(query, key) pairs a (left, right) window leaves visible at seqlen_q = seqlen_k = n."""
    i = torch.arange(n, dtype=torch.int64)
    lo = (i - left).clamp(min=0) if left >= 0 else torch.zeros_like(i)
    hi = (i + right).clamp(max=n - 1) if right >= 0 else torch.full_like(i, n - 1)
    return int((hi - lo + 1).clamp(min=0).sum())


def band_mask(n, left, right, device):
    """FlexAttention's block mask of the (left, right) band (-1: unbounded) at seqlen n."""
    from torch.nn.attention.flex_attention import create_block_mask

    def band(b, h, q_idx, kv_idx):
        keep = torch.ones_like(q_idx, dtype=torch.bool)
        if left >= 0:
            keep = keep & (kv_idx >= q_idx - left)
        if right >= 0:
            keep = keep & (kv_idx <= q_idx + right)
        return keep
    return create_block_mask(band, None, None, n, n, device=device)


def softcap_mod(softcap, slopes=None):
    """FlexAttention's score_mod for the softcap cap * tanh(s / cap) and / or ALiBi's -slope * |i - j|
    (``slopes`` by head; None: neither)."""
    def mod(score, b, h, q_idx, kv_idx):
        if softcap > 0:
            score = softcap * torch.tanh(score / softcap)
        if slopes is not None:
            score = score - slopes[h] * (q_idx - kv_idx).abs()
        return score
    return mod if softcap > 0 or slopes is not None else None


def alibi_slopes(h, device):
    """The ALiBi paper's slopes for ``h`` heads (a power of two): 2^(-8 (i + 1) / h)."""
    return torch.tensor([2 ** (-8 * (i + 1) / h) for i in range(h)], device=device, dtype=torch.float32)


def flex_setup(q, k, v, left, right, softcap=0.0, slopes=None):
    """FlexAttention on (batch, heads, seqlen, d) views with the band as a block mask (and the softcap
    as a score_mod); (out in our layout, leaves)."""
    from torch.nn.attention.flex_attention import flex_attention

    # the timed backward runs again on one graph (retain_graph): compiled backwards donate their saved
    # buffers by default, and a second call then refuses to run
    torch._functorch.config.donated_buffer = False
    mask = band_mask(q.shape[1], left, right, q.device)
    fn = torch.compile(flex_attention)
    leaves = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, score_mod=softcap_mod(softcap, slopes), block_mask=mask, enable_gqa=k.shape[2] != q.shape[2])
    return out.transpose(1, 2), leaves


def flex_forward(q, k, v, left, right, softcap=0.0, slopes=None):
    """FlexAttention's forward on (batch, heads, seqlen, d) views with the band as a block mask (and
    the softcap as a score_mod): a callable giving the output in our layout."""
    from torch.nn.attention.flex_attention import flex_attention

    mask = band_mask(q.shape[1], left, right, q.device)
    fn = torch.compile(flex_attention)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    return lambda _: fn(qt, kt, vt, score_mod=softcap_mod(softcap, slopes), block_mask=mask,
                        enable_gqa=k.shape[2] != q.shape[2]).transpose(1, 2)


def measure_fwd(name, q, k, v, window, softcap=0.0, slopes=None):
    """(ms, (out,)) of the forward alone."""
    with torch.no_grad():
        if name == "flex":
            run = flex_forward(q, k, v, *window, softcap, slopes)
            return median_ms(run, [None]), (run(None),)
        with hopper.prefer_hopper(name.startswith("gluon")):
            run = lambda _: ioattn.flash_attn_func(q, k, v, window_size=window, softcap=softcap,  # noqa: E731
                                                   alibi_slopes=slopes)
            return median_ms(run, [None]), (run(None),)


def measure(name, q, k, v, window, dout, softcap=0.0, slopes=None):
    """(ms, (dq, dk, dv) in our layout)."""
    if name == "flex":
        out, leaves = flex_setup(q, k, v, *window, softcap, slopes)
        grad = lambda _: [g.transpose(1, 2) for g in torch.autograd.grad(out, leaves, dout, retain_graph=True)]  # noqa: E731
    else:
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        with hopper_bwd.prefer_hopper_bwd(name.startswith("gluon")):
            out = ioattn.flash_attn_func(*leaves, window_size=window, softcap=softcap, alibi_slopes=slopes)
        grad = lambda _: torch.autograd.grad(out, leaves, dout, retain_graph=True)  # noqa: E731
    return median_ms(grad, [None]), grad(None)


def column_split(on):
    """``gluon-cs``: the backward's softcap form as the column split at every head dim, or the default."""
    from ioattn.plan import hopper_bwd
    if not hasattr(column_split, "default"):
        column_split.default = hopper_bwd.WS_SOFTCAP_COL_SPLIT_HEADDIMS
    hopper_bwd.WS_SOFTCAP_COL_SPLIT_HEADDIMS = (128,) if on else column_split.default


def alibi_forms(name):
    """``gluon-was``: the forward's first ALiBi configuration (the fp32 columns at every head dim:
    d = 128 at 64-key tiles four deep, d = 64 in pingpong), for a same-run A/B; ``gluon-magic``: the
    magic-number form for causal calls of every length and for windows at its head dims; any other: the
    default."""
    if not hasattr(alibi_forms, "default"):
        alibi_forms.default = (hopper.ALIBI_MAGIC_HEADDIMS, dict(hopper.ALIBI_MAGIC_CAUSAL_MIN_SEQLEN),
                               hopper.ALIBI_MAGIC_WINDOW_HEADDIMS)
    heads, causal, windows = alibi_forms.default
    if name == "gluon-was":
        heads = ()
    elif name == "gluon-magic":
        causal, windows = {d: 0 for d in heads}, heads
    hopper.ALIBI_MAGIC_HEADDIMS, hopper.ALIBI_MAGIC_CAUSAL_MIN_SEQLEN = heads, dict(causal)
    hopper.ALIBI_MAGIC_WINDOW_HEADDIMS = windows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pass", dest="which", choices=("bwd", "fwd"), default="bwd")
    ap.add_argument("--headdims", default="64,128,256")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--windows", default="256:0,1024:0,4096:0")
    ap.add_argument("--providers", default="gluon,portable,flex")
    ap.add_argument("--flex-headdims", default="128")
    ap.add_argument("--softcap", type=float, default=0.0)
    ap.add_argument("--alibi", action="store_true")
    args = ap.parse_args()
    providers = args.providers.split(",")
    flex_dims = {int(d) for d in args.flex_headdims.split(",")}
    windows = [tuple(int(x) for x in w.split(":")) for w in args.windows.split(",")]
    os.makedirs(args.out, exist_ok=True)
    fwd = args.which == "fwd"
    sink = open(os.path.join(args.out, "ab_window_fwd.jsonl" if fwd else "ab_window.jsonl"), "w")
    print(f"{args.which}: TFLOP/s" + (f", softcap {args.softcap:g}" if args.softcap else "")
          + (", ALiBi" if args.alibi else ""))
    print(f"{'d':>3} {'N':>5} {'window':>11} " + " ".join(f"{p:>9}" for p in providers) + f" {'g/port':>6} {'g/flex':>6}")
    for d in map(int, args.headdims.split(",")):
        h = HIDDEN // d
        for n in map(int, args.seqlens.split(",")):
            b = TOKENS // n
            q = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            dout = torch.randn_like(q)
            slopes = alibi_slopes(h, q.device) if args.alibi else None
            for window in windows:
                flops = (1.0 if fwd else 2.5) * 4 * b * h * d * visible_pairs(n, *window)
                res, grads, notes = {}, {}, []
                for name in providers:
                    if (name == "flex" and d not in flex_dims) or (name == "gluon-cs" and d != 128):
                        continue
                    rec = dict(headdim=d, seqlen=n, batch=b, window=list(window), provider=name, softcap=args.softcap,
                               alibi=args.alibi, **{"pass": args.which})
                    try:
                        column_split(name == "gluon-cs")
                        alibi_forms(name)
                        if name != "flex":
                            gluon = name.startswith("gluon")
                            with hopper_bwd.prefer_hopper_bwd(gluon), hopper.prefer_hopper(gluon):
                                plan = ioattn.explain_dispatch(q, k, v, window_size=window, softcap=args.softcap,
                                                               alibi_slopes=slopes)
                            rec["kernel"] = plan.forward["kernel"] if fwd else plan.backward["kernels"]
                            if not fwd and "softcap" in plan.backward:
                                rec["form"] = plan.backward["softcap"]
                        if fwd:
                            ms, grads[name] = measure_fwd(name, q, k, v, window, args.softcap, slopes)
                        else:
                            ms, grads[name] = measure(name, q, k, v, window, dout, args.softcap, slopes)
                        res[name] = flops / ms / 1e9
                        rec.update(ms=ms, tflops=res[name])
                    except Exception as e:  # noqa: BLE001 - recorded, not fatal
                        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        notes.append(f"{name}: {rec['error'][:80]}")
                    sink.write(json.dumps(rec) + "\n")
                    sink.flush()
                ok = all(bool(torch.isfinite(t).all()) for g in grads.values() for t in g)
                if "portable" in grads:
                    for name, g in grads.items():
                        ok &= max((a.float() - r.float()).abs().max().item() for a, r in zip(g, grads["portable"])) < 0.05
                cells = " ".join(f"{res[p]:9.0f}" if p in res else f"{'-':>9}" for p in providers)
                ratio = lambda a, c: f"{res[a] / res[c]:6.2f}" if a in res and c in res else f"{'-':>6}"  # noqa: E731
                print(f"{d:>3} {n:>5} {str(window):>11} {cells} {ratio('gluon', 'portable')} {ratio('gluon', 'flex')}"
                      + ("" if ok else " MISMATCH") + ("  [" + "; ".join(notes) + "]" if notes else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
