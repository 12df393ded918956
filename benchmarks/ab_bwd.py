"""A/B of backward kernels in one process: the portable Triton backward, the Gluon Hopper backward
(``ioattn.backends.hopper_backward``, the warp-specialised kernel: provider "gluon-ws", at d=256 its
column-split form) and SDPA's flash and cuDNN backward passes, each timed alone (the forward outside
the timed region). The Gluon providers are left out at head dims the kernel does not cover
(``BWD_VARIANT_HEADDIMS``: 64, 128, 256).

    python benchmarks/ab_bwd.py --out DIR [--headdims 64,128,256] [--seqlens 1024,4096,16384]
                                [--providers portable,gluon-ws,sdpa-flash,sdpa-cudnn] [--rounds R]
                                [--time-failed] [--sass]

``--rounds R``: every provider timed R times, interleaved; the table gives each one's median round.
The ws kernel's A/B arms: "gluon-ws-dq128" (the fp32 dQ staging tile at the 128 B swizzle),
"gluon-ws-m64" (64 query rows a step at d = 64, ``WS_BLOCK_M``), "gluon-ws-accstore" (dK / dV stored
from the accumulator layout, ``WS_COALESCED_STORE`` off), "gluon-ws-dqflat" / "gluon-ws-dq32" (the dQ
staging tile and accumulator in the accumulator's order, ``WS_DQ_FLAT``, or the swizzled 2-D tile),
"gluon-ws-lse" (lse folded into S^T's accumulator, ``WS_LSE_IN_ACC``), "gluon-ws-wgsplit" (each
consumer warpgroup a partition of its own, ``WS_WG_PARTITIONS``), "gluon-ws-dqhifirst" /
"gluon-ws-dqlofirst" (the column split handing dQ's high half to the writer first or last,
``WS_DQ_HI_FIRST``). The measurements and the options that were tried and removed (providers of
earlier versions of this script): docs/decisions/backward-ws-step.md, backward-dq-path.md,
split-products.md, hopper-backward-kernel.md.

bf16 (``--dtype fp16``: fp16), 16384 tokens, hidden 2048 (the bench's grid). Every variant's gradients are
checked against the float64 oracle (2x PyTorch's own same-dtype error, ``conftest.assert_within_torch_error``'s
criterion) on the first sequence length of each (head dim, mask) before it is timed; timing is
``ioattn.bench.timing.median_ms`` (device time, median of 20). FLOPs: 2.5x the forward's.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

from ioattn import backends
from ioattn.plan import hopper
from ioattn.plan import hopper_bwd
from ioattn.bench.timing import attention_flops, median_ms
from ioattn.reference import attention_ref
from ioattn.semantics import Semantics


def portable(dout, q, k, v, causal):
    scale = q.shape[-1] ** -0.5
    window = (-1, 0) if causal else (-1, -1)
    with hopper.prefer_hopper(False):
        out, lse = backends.triton_forward(q, k, v, None, None, q.shape[1], k.shape[1], Semantics(scale, window),
                                           None, 0)

    def run():
        with hopper_bwd.prefer_hopper_bwd(False):  # the portable kernels, not the dispatch's Gluon backward
            return backends.triton_backward(dout, q, k, v, out, lse, None, None, q.shape[1], k.shape[1],
                                            Semantics(scale, window), None, 0)
    return run


def gluon(deterministic=False, **overrides):
    """The Gluon backward (the ws kernel). ``overrides``: tables of ``ioattn.plan.hopper_bwd`` (A/B
    switches) set for this provider's calls only, e.g. ``WS_DQ_SWIZZLE={...}``."""
    def setup(dout, q, k, v, causal):
        scale = q.shape[-1] ** -0.5
        out, lse = backends.hopper_forward(q, k, v, scale, causal)

        def run():
            saved = {name: getattr(hopper_bwd, name) for name in overrides}
            for name, value in overrides.items():
                setattr(hopper_bwd, name, value)
            if overrides:  # the backward's plans are cached on the switches, not on these tables
                backends.clear_routes()
            try:
                return backends.hopper_backward(dout, q, k, v, out, lse, scale, causal, deterministic=deterministic)
            finally:
                for name, value in saved.items():
                    setattr(hopper_bwd, name, value)
                if overrides:
                    backends.clear_routes()
        return run
    setup.gluon = True
    return setup


def covers(setup, d):
    """Whether a provider runs at head dim ``d`` (a Gluon one only at the kernel's head dims)."""
    return not getattr(setup, "gluon", False) or d in hopper_bwd.BWD_VARIANT_HEADDIMS["ws"]


def sdpa(backend):
    def setup(dout, q, k, v, causal):
        from torch.nn.attention import sdpa_kernel
        leaves = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        g = dout.transpose(1, 2)
        return lambda: [t.transpose(1, 2) for t in torch.autograd.grad(out, leaves, g, retain_graph=True)]
    return setup


def check(grads, dout, q, k, v, causal):
    window = (-1, 0) if causal else (-1, -1)
    ref_in = [t.double().requires_grad_() for t in (q, k, v)]
    ref, _ = attention_ref(*ref_in, window=window)
    ref_g = torch.autograd.grad(ref, ref_in, dout.double())
    same_in = [t.clone().requires_grad_() for t in (q, k, v)]
    same, _ = attention_ref(*same_in, window=window, upcast=False)
    same_g = torch.autograd.grad(same, same_in, dout)
    for g, r, s in zip(grads, ref_g, same_g):
        err, base = (g.double() - r).abs().max().item(), (s.double() - r).abs().max().item()
        if not (err == err and err <= 2 * base + 1e-4):
            return False
    return True


def main():
    from torch.nn.attention import SDPBackend
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--headdims", default="64,128")
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--tag", default="ab_bwd")
    ap.add_argument("--rounds", type=int, default=1, help="time the providers R times each, interleaved")
    ap.add_argument("--providers", default="", help="comma-separated subset of the providers (default: all)")
    ap.add_argument("--heads", type=int, default=0,
                    help="query (= K/V) heads; 0: hidden 2048 / head dim (the bench's grid). 33 gives 33 x 128 = "
                         "4224 key blocks of 128 at 16k tokens, 32 whole waves of 132 SMs, where the bench's grid "
                         "has 2048 at d = 128 (15.5 waves): the last wave's cost by difference")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"), help="the inputs' dtype")
    ap.add_argument("--sass", action="store_true",
                    help="at the end, each Gluon backward kernel compiled in this process: its SASS's counts of "
                         "products, stores, reductions, fences and TMA operations, and the ptxas version (a "
                         "diagnostic build's record of what the compiler kept, read on the machine that ran it)")
    ap.add_argument("--time-failed", action="store_true",
                    help="time a provider whose gradients fail the oracle too (a diagnostic build with a part "
                         "compiled out); its rows keep ok=false and the table marks them with *")
    args = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if args.heads < 0:
        ap.error(f"--heads must be 0 (the bench's grid) or a positive head count, got {args.heads}")
    os.makedirs(args.out, exist_ok=True)
    sink = open(os.path.join(args.out, f"{args.tag}.jsonl"), "w")
    variants = {"portable": portable, "gluon-ws": gluon(),
                "gluon-ws-dq128": gluon(WS_DQ_SWIZZLE={64: 128, 128: 128, 256: 128}),
                "gluon-ws-m64": gluon(WS_BLOCK_M={64: 64, 128: 64, 256: 64}),
                "gluon-ws-accstore": gluon(WS_COALESCED_STORE=False),
                "gluon-ws-dqflat": gluon(WS_DQ_FLAT={64: True, 128: True}),
                "gluon-ws-dq32": gluon(WS_DQ_FLAT={64: False, 128: False}),
                "gluon-ws-lse": gluon(WS_LSE_IN_ACC={64: True, 128: True}),
                "gluon-ws-wgsplit": gluon(WS_WG_PARTITIONS={64: True, 128: True}),
                "gluon-ws-det": gluon(deterministic=True),
                "gluon-ws-dqhifirst": gluon(WS_DQ_HI_FIRST=(192, 256)),
                "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    if args.providers:
        variants = {name: variants[name] for name in args.providers.split(",")}
    rows = []
    for d in map(int, args.headdims.split(",")):
        for causal in [bool(int(c)) for c in args.causal.split(",")]:
            ok = {}
            for n in map(int, args.seqlens.split(",")):
                shape = (16384 // n, n, args.heads or 2048 // d, d)
                q, k, v, dout = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
                runs = {}
                for name, setup in variants.items():
                    if not covers(setup, d):
                        continue
                    try:  # a variant that fails to compile or run is reported and the rest go on
                        runs[name] = setup(dout, q, k, v, causal)
                        if name not in ok:  # the oracle at the first length; above 4096 on one head
                            # (float64 scores of every head at 16384 need > 100 GB)
                            part = [t[:, :, :1].contiguous() if n > 4096 else t for t in (dout, q, k, v)]
                            ok[name] = check(setup(*part, causal)(), *part, causal)
                    except Exception as e:  # noqa: BLE001
                        print(f"{name} d={d} causal={causal} N={n}: {type(e).__name__}: {str(e)[:1500]}", flush=True)
                        ok[name], runs[name] = False, None
                for rnd in range(args.rounds):
                    for name, run in runs.items():
                        timed = run is not None and (ok[name] or args.time_failed)
                        ms = median_ms(lambda _: run(), [None]) if timed else float("inf")
                        tf = attention_flops(shape[0], shape[2], n, n, d, causal, "bwd") / ms / 1e9
                        rec = dict(headdim=d, causal=causal, seqlen=n, heads=shape[2], dtype=args.dtype,
                                   variant=name, ok=ok[name], ms=ms,
                                   tflops=tf, round=rnd)
                        sink.write(json.dumps(rec) + "\n")
                        sink.flush()
                        rows.append(rec)
                del runs
                torch.cuda.empty_cache()
    names = list(variants)
    width = {n: max(11, len(n)) for n in names}
    print(f"{'d':>3} {'c':>1} {'N':>6} " + " ".join(f"{n:>{width[n]}}" for n in names))
    keys = list(dict.fromkeys((r["headdim"], r["causal"], r["seqlen"]) for r in rows))  # in run order
    for key in keys:  # the median round of each provider
        cell = {}
        for name in names:
            mine = sorted((r for r in rows if (r["headdim"], r["causal"], r["seqlen"]) == key and r["variant"] == name),
                          key=lambda r: r["tflops"])
            if mine:
                cell[name] = mine[len(mine) // 2]
        r0 = next(iter(cell.values()))
        print(f"{r0['headdim']:>3} {int(r0['causal']):>1} {r0['seqlen']:>6} " +
              " ".join(f"{'n/a':>{width[x]}}" if x not in cell else f"{cell[x]['tflops']:{width[x]}.0f}"
                       if cell[x]["ok"] else f"{cell[x]['tflops']:{width[x] - 1}.0f}*"
                       if args.time_failed and cell[x]["ms"] < float("inf") else f"{'FAIL':>{width[x]}}" for x in names))
    if args.sass:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
        from gluon_aot import print_compiled_sass  # tools/, beside the compile checks
        from ioattn.kernels import hopper_backward_ws
        print_compiled_sass((hopper_backward_ws.hopper_bwd_ws_kernel,))
    return 0


if __name__ == "__main__":
    sys.exit(main())
