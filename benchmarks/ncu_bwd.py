"""One backward call per head dim (ours, and with ``--cudnn`` SDPA's cuDNN backward after it), for
Nsight Compute: warm-up calls first, then the profiled calls, each inside an NVTX range named after
it (``ioattn-d128``, ``cudnn-d128``), so that every kernel of a backward (preprocess, main, dQ
conversion) is profiled and attributed:

    ncu --nvtx --nvtx-include "ioattn-d128/" --nvtx-include "cudnn-d128/" ... \
        python benchmarks/ncu_bwd.py --headdims 128 --seqlen 16384 --cudnn

SDPA's backward runs on autograd's device thread, outside an NVTX range pushed here; ``--cudnn-only``
runs only cuDNN's forward and backward, without warm-up, for a profile of every kernel (the
backward's are named ``*bprop*`` or so).

bf16, 16384 tokens in all (batch = 16384 // seqlen), hidden 2048; ours is the Gluon backward
(the ws kernel), its inputs from the Gluon forward; cuDNN's runs through
``torch.autograd.grad`` of SDPA's cuDNN forward (the forward outside the range).
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import ioattn
from ioattn.plan import hopper
from ioattn.backends import hopper_backward

WARMUP = 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--headdims", default="128,256")
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--cudnn", action="store_true", help="SDPA's cuDNN backward too, after ours")
    ap.add_argument("--cudnn-only", action="store_true", help="only cuDNN's forward + backward, no warm-up")
    ap.add_argument("--dq-flat", action="store_true", help="ours with the flat dQ tile (WS_DQ_FLAT)")
    args = ap.parse_args()
    if args.dq_flat:
        from ioattn.plan import hopper_bwd
        hopper_bwd.WS_DQ_FLAT = {64: True, 128: True}
    if args.cudnn_only:
        return cudnn_only(args)
    n = args.seqlen
    calls = []
    for d in map(int, args.headdims.split(",")):
        batch, heads = max(1, 16384 // n), 2048 // d
        q, k, v = (torch.randn(batch, n, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        with hopper.prefer_hopper(True), torch.no_grad():
            out, lse = ioattn.flash_attn_func(q, k, v, causal=args.causal, return_attn_probs=True)[:2]
        dout = torch.randn_like(out)
        calls.append((f"ioattn-d{d}", lambda q=q, k=k, v=v, out=out, lse=lse, dout=dout, d=d: hopper_backward(
            dout, q, k, v, out, lse, d ** -0.5, args.causal)))
        if args.cudnn:
            qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                ot = F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
            dot = dout.transpose(1, 2)
            calls.append((f"cudnn-d{d}", lambda ot=ot, qt=qt, kt=kt, vt=vt, dot=dot: torch.autograd.grad(
                ot, (qt, kt, vt), dot, retain_graph=True)))
    for _, call in calls:
        for _ in range(WARMUP):
            call()
    torch.cuda.synchronize()
    for name, call in calls:
        torch.cuda.nvtx.range_push(name)
        call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    print("profiled ranges: " + ", ".join(name for name, _ in calls), flush=True)


def cudnn_only(args):
    n = args.seqlen
    for d in map(int, args.headdims.split(",")):
        batch, heads = max(1, 16384 // n), 2048 // d
        q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
        out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        print(f"cudnn d={d}: forward and backward done", flush=True)


if __name__ == "__main__":
    main()
