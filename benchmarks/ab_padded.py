"""A/B for head dims the Gluon kernels do not have (docs/decisions/padded-head-dims.md): the call's q, k, v (and in the
backward out, dO) zero-padded on the host to the next head dim the Gluon kernels cover (64, 128,
256), the Gluon forward / backward run there, the result sliced back to d and made contiguous, the
copies timed with it: "gluon-pad", the launchers' own path (``hopper.padded_headdim``: in place for d a
multiple of 8, ``hopper.padded_in_place``; else the pads by ``gluon_fwd.pad_head``), "gluon-fpad"
the copies by ``F.pad`` at every d (the first padded path's form), "gluon-pad-wide" the in-place path with its
products over all 256 columns at d = 136-192 (``hopper.split_cols`` / ``bwd_split_cols`` off,
docs/decisions/split-products.md), "gluon-pad-dqlofirst" (backward only) the in-place path with dQ's low half handed to the
writer first (``hopper_bwd.WS_DQ_HI_FIRST`` off),
"gluon-pad-ring" / "gluon-pad-whole" (forward only) the in-place path with the split ring or without it
(``hopper.split_ring``),
"gluon-pad-pp" / "gluon-pad-pers" / "gluon-pad-wg3" (forward only) the in-place path in one variant at every
length (at a head dim the kernels have, e.g. 64, the launcher's own path with that variant);
against the default dispatch ("ioattn": the portable kernels at these head dims before the padded
policy, ``hopper.PADDED_MIN_SEQLEN``'s choice after), the portable kernels themselves ("portable"), and
SDPA's cuDNN and FlashAttention-2 backends, in one process.

    python benchmarks/ab_padded.py --out DIR [--headdims 80,96,192] [--seqlens 512,1024,4096,16384]
                                   [--causal 0,1] [--passes fwd,bwd] [--rounds 3]

Zero columns change nothing: Q K^T is the same, the output's extra columns are P times V's zero
columns, and every gradient's extra columns are zero; the scale stays the call's (d ** -0.5). bf16,
16384 tokens (batch = 16384 / N), hidden 2048 (heads = 2048 // d), FLOPs counted at the call's own d
(the padded product's extra columns are waste, not work). Each provider is checked against the
float64 oracle (2x PyTorch's own error; the forward's output, the backward's three gradients) at the
first length of each (head dim, mask) before it is timed; the backward alone is timed (autograd.grad
of a kept forward for the API and SDPA; the padded provider's pads, kernel and slices); the median
of ``--rounds`` interleaved rounds of ``ioattn.bench.timing.median_ms``.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

import ioattn
from ioattn.plan import hopper
from ioattn.plan import hopper_bwd
from ioattn import backends
from ioattn.bench.run import _check
from ioattn.bench.timing import attention_flops, median_ms
from ioattn.backends import hopper_backward

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_bwd import check as check_bwd  # noqa: E402  (the gradients against the float64 oracle)

GLUON_HEADDIMS = (64, 128, 256)


def padded_dim(d):
    return next(p for p in GLUON_HEADDIMS if p >= d)


def pad(t, dp):
    return F.pad(t, (0, dp - t.shape[-1]))


def gluon_fpad_fwd(q, k, v, causal):
    d = q.shape[-1]
    dp = padded_dim(d)
    out, lse = backends.hopper_forward(pad(q, dp), pad(k, dp), pad(v, dp), d ** -0.5, causal)
    return out[..., :d].contiguous(), lse


def gluon_pad_fwd(q, k, v, causal):
    return backends.hopper_forward(q, k, v, q.shape[-1] ** -0.5, causal)  # the launcher pads (gluon_fwd.pad_head)


def gluon_pad_whole_fwd(q, k, v, causal):
    """The in-place path with the K / V ring in whole 256-wide tiles, two stages (``hopper.split_ring`` off;
    docs/decisions/split-products.md)."""
    with hopper.split_ring(False):
        return backends.hopper_forward(q, k, v, q.shape[-1] ** -0.5, causal)


def gluon_pad_wide_fwd(q, k, v, causal):
    """The in-place path with its products over all 256 columns (``hopper.split_cols`` off)."""
    with hopper.split_cols(False):
        return backends.hopper_forward(q, k, v, q.shape[-1] ** -0.5, causal)


def gluon_pad_ring_fwd(q, k, v, causal):
    """The in-place path with the split ring (``hopper.split_ring``: K / V tiles in 128 + 64-column
    buffers, three stages; the default since: "gluon-pad" ran without it until then)."""
    with hopper.split_ring(True):
        return backends.hopper_forward(q, k, v, q.shape[-1] ** -0.5, causal)


def gluon_pad_variant_fwd(name):
    """The in-place path with the forward's variant forced (``hopper.variant``): "pingpong" (one tile a
    program) or "persistent" at every length."""
    def run(q, k, v, causal):
        with hopper.variant(name):
            return backends.hopper_forward(q, k, v, q.shape[-1] ** -0.5, causal)
    return run


def api_fwd(q, k, v, causal):
    return ioattn.flash_attn_func(q, k, v, causal=causal)


def portable_fwd(q, k, v, causal):
    with hopper.prefer_hopper(False):
        return ioattn.flash_attn_func(q, k, v, causal=causal)


def sdpa_fwd(backend):
    def run(q, k, v, causal):
        from torch.nn.attention import sdpa_kernel
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                                  is_causal=causal).transpose(1, 2)
    return run


def fwd_providers():
    from torch.nn.attention import SDPBackend
    return {"ioattn": api_fwd, "portable": portable_fwd, "gluon-pad": lambda *a: gluon_pad_fwd(*a)[0],
            "gluon-fpad": lambda *a: gluon_fpad_fwd(*a)[0], "gluon-pad-wide": lambda *a: gluon_pad_wide_fwd(*a)[0],
            "gluon-pad-pp": lambda *a: gluon_pad_variant_fwd("pingpong")(*a)[0],
            "gluon-pad-pers": lambda *a: gluon_pad_variant_fwd("persistent")(*a)[0],
            "gluon-pad-wg3": lambda *a: gluon_pad_variant_fwd("wg3")(*a)[0],
            "gluon-pad-ring": lambda *a: gluon_pad_ring_fwd(*a)[0],
            "gluon-pad-whole": lambda *a: gluon_pad_whole_fwd(*a)[0],
            "sdpa-cudnn": sdpa_fwd(SDPBackend.CUDNN_ATTENTION), "sdpa-flash": sdpa_fwd(SDPBackend.FLASH_ATTENTION)}


def bwd_setup(name):
    """A setup (dout, q, k, v, causal) -> run() returning (dq, dk, dv)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def setup(dout, q, k, v, causal):
        if name == "gluon-fpad":
            d = q.shape[-1]
            dp = padded_dim(d)
            out, lse = gluon_fpad_fwd(q, k, v, causal)

            def run():  # the forward keeps the call's own tensors; the backward pads them again
                grads = hopper_backward(pad(dout, dp), pad(q, dp), pad(k, dp), pad(v, dp), pad(out, dp), lse, d ** -0.5,
                                        causal)
                return [g[..., :d].contiguous() for g in grads]
            return run
        if name == "gluon-pad":  # the launchers' own padded path
            out, lse = gluon_pad_fwd(q, k, v, causal)
            return lambda: hopper_backward(dout, q, k, v, out, lse, q.shape[-1] ** -0.5, causal)
        if name == "gluon-pad-dqlofirst":  # the same with dQ's low half handed over first
            out, lse = gluon_pad_fwd(q, k, v, causal)

            def run():
                saved, hopper_bwd.WS_DQ_HI_FIRST = hopper_bwd.WS_DQ_HI_FIRST, ()
                backends.clear_routes()  # the plans are cached on the switches, not on this table
                try:
                    return hopper_backward(dout, q, k, v, out, lse, q.shape[-1] ** -0.5, causal)
                finally:
                    hopper_bwd.WS_DQ_HI_FIRST = saved
                    backends.clear_routes()
            return run
        if name == "gluon-pad-wide":  # the same with the products 256 wide (hopper.bwd_split_cols off)
            out, lse = gluon_pad_fwd(q, k, v, causal)

            def run():
                with hopper.bwd_split_cols(False):
                    return hopper_backward(dout, q, k, v, out, lse, q.shape[-1] ** -0.5, causal)
            return run
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        if name in ("ioattn", "portable"):
            pref = None if name == "ioattn" else False  # None: the default policy; False: the portable kernels
            with hopper.prefer_hopper(pref), hopper_bwd.prefer_hopper_bwd(pref):
                out = ioattn.flash_attn_func(*leaves, causal=causal)

            def run():
                with hopper_bwd.prefer_hopper_bwd(pref):
                    return torch.autograd.grad(out, leaves, dout, retain_graph=True)
            return run
        backend = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}[name]
        tl = [t.transpose(1, 2) for t in leaves]
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(*tl, is_causal=causal)
        g = dout.transpose(1, 2)
        return lambda: torch.autograd.grad(out, leaves, g, retain_graph=True)
    return setup


def check_fwd(fn, q, k, v, causal):
    """The forward's output against the float64 oracle (the train benchmark's check)."""
    return _check(fn, q, k, v, causal)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--headdims", default="80,96,192")
    ap.add_argument("--seqlens", default="512,1024,4096,16384")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--passes", default="fwd,bwd")
    ap.add_argument("--providers", default="ioattn,portable,gluon-pad,gluon-fpad,sdpa-cudnn,sdpa-flash")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tag", default="ab_padded")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sink = open(os.path.join(args.out, f"{args.tag}.jsonl"), "w")
    names = args.providers.split(",")
    rows = []
    for mode in args.passes.split(","):
        for d in map(int, args.headdims.split(",")):
            for causal in [bool(int(c)) for c in args.causal.split(",")]:
                ok = {}
                for n in map(int, args.seqlens.split(",")):
                    shape = (16384 // n, n, 2048 // d, d)
                    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                    runs = {}
                    for name in names:
                        try:  # a provider that fails is reported and the rest go on
                            if mode == "fwd":
                                fn = fwd_providers()[name]
                                if name not in ok:  # the oracle at the first length, above 4096 on one head
                                    part = [t[:, :, :1].contiguous() if n > 4096 else t for t in (q, k, v)]
                                    ok[name] = check_fwd(fn, *part, causal)
                                runs[name] = (lambda fn=fn: fn(q, k, v, causal))
                            else:
                                if name not in ok:
                                    part = [t[:, :, :1].contiguous() if n > 4096 else t for t in (dout, q, k, v)]
                                    ok[name] = check_bwd(bwd_setup(name)(*part, causal)(), *part, causal)
                                runs[name] = bwd_setup(name)(dout, q, k, v, causal)
                        except Exception as e:  # noqa: BLE001
                            print(f"{mode} {name} d={d} causal={causal} N={n}: {type(e).__name__}: {str(e)[:600]}",
                                  flush=True)
                            ok[name], runs[name] = False, None
                    for rnd in range(args.rounds):
                        for name, run in runs.items():
                            ms = median_ms(lambda _: run(), [None]) if run is not None and ok[name] else float("inf")
                            tf = attention_flops(shape[0], shape[2], n, n, d, causal, mode) / ms / 1e9
                            rec = dict(pass_=mode, headdim=d, causal=causal, seqlen=n, heads=shape[2], provider=name,
                                       ok=ok[name], ms=ms, tflops=tf, round=rnd)
                            sink.write(json.dumps(rec) + "\n")
                            sink.flush()
                            rows.append(rec)
                    del runs
                    torch.cuda.empty_cache()
    width = {n: max(10, len(n)) for n in names}
    print(f"{'pass':>4} {'d':>3} {'c':>1} {'N':>6} " + " ".join(f"{n:>{width[n]}}" for n in names))
    keys = list(dict.fromkeys((r["pass_"], r["headdim"], r["causal"], r["seqlen"]) for r in rows))
    for key in keys:  # the median round of each provider
        cells = []
        for name in names:
            mine = sorted((r for r in rows if (r["pass_"], r["headdim"], r["causal"], r["seqlen"]) == key
                           and r["provider"] == name), key=lambda r: r["tflops"])
            if not mine:
                cells.append(f"{'n/a':>{width[name]}}")
            else:
                r = mine[len(mine) // 2]
                cells.append(f"{r['tflops']:{width[name]}.0f}" if r["ok"] else f"{'FAIL':>{width[name]}}")
        print(f"{key[0]:>4} {key[1]:>3} {int(key[2]):>1} {key[3]:>6} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
