"""Gradient errors on climbing scores (tests/test_gpu.py's ``_ramp_inputs``) with and without the Gluon
forward's conditional rescaling: the kernels' error against the float64 oracle and PyTorch's own in the
same dtype, per tensor, to tell whether a gradient miss comes from the option (the forward's O and lse)
or from the conditioning of the inputs (docs/decisions/conditional-rescale.md). Prints one line a configuration."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import ioattn  # noqa: E402
from ioattn import hopper  # noqa: E402
from ioattn.reference import attention_ref  # noqa: E402
from test_gpu import _ramp_inputs  # noqa: E402


def errors(q, k, v, causal, cond, by_warp):
    with hopper.prefer_hopper(True), hopper.conditional_rescale(cond), hopper.rescale_by_warp(by_warp):
        out = ioattn.flash_attn_func(q, k, v, causal=causal)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    win = (-1, 0) if causal else (-1, -1)
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, _ = attention_ref(*ref_in, window=win)
    ref_g = torch.autograd.grad(ref, ref_in, dout.double())
    same_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    same, _ = attention_ref(*same_in, window=win, upcast=False)
    same_g = torch.autograd.grad(same, same_in, dout)
    err = lambda a, r: (a.double() - r).abs().max().item()  # noqa: E731
    return {n: (err(a, r), err(s, r)) for n, a, r, s in
            zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_g), (same, *same_g))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="1,777,1500,2,1")
    ap.add_argument("--cases", default="persistent:256,pingpong:256,persistent:128,wg3:64")
    args = ap.parse_args()
    b, sq, sk, h, hkv = map(int, args.shape.split(","))
    for case in args.cases.split(","):
        variant, d = case.split(":")
        d = int(d)
        for causal in (False, True):
            torch.manual_seed(0)
            q, k, v = _ramp_inputs(b, sq, sk, h, hkv, d, torch.bfloat16)
            with hopper.variant(variant):
                for cond, by_warp in ((False, False), (True, False), (True, True)):
                    torch.manual_seed(1)
                    e = errors(q, k, v, causal, cond, by_warp)
                    tag = "off" if not cond else ("warp" if by_warp else "thread")
                    print(f"{variant:10s} d={d} causal={causal!s:5s} {tag:6s} " + " ".join(
                        f"{n} {a:.3e}/{s:.3e} ({a / max(s, 1e-30):.2f}x)" for n, (a, s) in e.items()), flush=True)


if __name__ == "__main__":
    main()
