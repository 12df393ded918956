"""A/B of the varlen (packed) kernels on ragged batches: the Gluon Hopper kernels' IS_VARLEN forms
against the portable Triton kernels, with torch's own varlen attention (SDPA on nested jagged
tensors, the backend torch picks) measured in the same run as the peer.

    python benchmarks/ab_varlen.py --out DIR [--pass fwd|bwd] [--headdims 64,128] [--means 512,2048]

``--pass fwd`` (default): the forward, gluon = the Gluon forward (``hopper.prefer_hopper(True)``,
``hopper.GLUON_VARLEN`` switched on), portable = ``prefer_hopper(False)``. ``--pass bwd``: the
backward alone (``torch.autograd.grad`` of a forward kept alive, ``retain_graph``), gluon = the Gluon
backward's IS_VARLEN form (``hopper_bwd.prefer_hopper_bwd(True)`` around the forward, whose switch
governs its backward), portable = ``prefer_hopper_bwd(False)``; both behind the same (default)
forward.

bf16, hidden 2048, about 16384 tokens a batch: sequence lengths drawn uniformly from [mean / 4,
7 mean / 4] (seed 0) until the total passes 16384. FLOPs: the sum over sequences of the forward's
4 * H * L_q * L_k * D (halved when causal), times 2.5 for the backward (the anchors' convention).
Each provider's output (``--pass bwd``: its dQ, dK, dV) is checked finite and within 0.05 of the
portable one's (a smoke check: the float64 oracle is the GPU tests' job); timing is
``ioattn.bench.timing.median_ms`` (device time, median of 20). Writes DIR/ab_varlen.jsonl
(ab_varlen_bwd.jsonl for the backward), one record a provider and point; a provider that fails
records its error.
"""
import argparse
import json
import os
import random

import torch

import ioattn
from ioattn.plan import hopper
from ioattn.plan import hopper_bwd
from ioattn.bench.timing import median_ms

TOKENS, HIDDEN = 16384, 2048


def lengths(mean, seed=0):
    rng = random.Random(seed)
    out = []
    while sum(out) < TOKENS:
        out.append(rng.randint(mean // 4, 7 * mean // 4))
    return out


def _njt(t, offsets):
    """(total, heads, d) packed rows as a jagged (batch, heads, ragged, d) nested tensor for SDPA."""
    return torch.nested.nested_tensor_from_jagged(t, offsets=offsets).transpose(1, 2)


def _sdpa_njt(q, k, v, cu, causal):
    """torch's varlen attention: SDPA on nested jagged tensors; (total, heads, d) out."""
    offsets = cu.long()
    out = torch.nn.functional.scaled_dot_product_attention(_njt(q, offsets), _njt(k, offsets), _njt(v, offsets),
                                                           is_causal=causal)
    return out.transpose(1, 2).values()


def _forward(name, q, k, v, cu, max_len, causal, backward):
    """Provider ``name``'s output; for the backward pass the Gluon / portable choice is the backward's."""
    if name == "sdpa-njt":
        return _sdpa_njt(q, k, v, cu, causal)
    on = name == "gluon"
    switch = hopper_bwd.prefer_hopper_bwd(on) if backward else hopper.prefer_hopper(on)
    with switch:
        return ioattn.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=causal)


def _device_kernels(fn):
    """The names of the device kernels one call of ``fn`` launches, longest first (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [e.key[:90] for e in sorted(events, key=lambda e: -e.device_time_total)]


def _kernel(name, q, k, v, cu, max_len, causal, backward):
    if name == "sdpa-njt":  # the backend torch picked, named by the kernels it launched
        if backward:
            leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
            out = _sdpa_njt(*leaves, cu, causal)
            run = lambda: torch.autograd.grad(out, leaves, torch.ones_like(out), retain_graph=True)  # noqa: E731
        else:
            run = lambda: _sdpa_njt(q, k, v, cu, causal)  # noqa: E731
        return "SDPA (nested jagged): " + ", ".join(_device_kernels(run)[:3])
    on = name == "gluon"
    with (hopper_bwd.prefer_hopper_bwd(on) if backward else hopper.prefer_hopper(on)):
        plan = ioattn.explain_dispatch(q, k, v, causal=causal, cu_seqlens_q=cu, max_seqlen_q=max_len)
    return plan.backward["kernels"] if backward else plan.forward["kernel"]


def measure(name, q, k, v, cu, max_len, causal, backward):
    """(ms, result): the forward's out, or the backward's (dq, dk, dv) for one fixed dO."""
    if not backward:
        with torch.no_grad():
            run = lambda _: _forward(name, q, k, v, cu, max_len, causal, False)  # noqa: E731
            return median_ms(run, [None]), run(None)
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    out = _forward(name, *leaves, cu, max_len, causal, True)
    dout = torch.randn(out.shape, generator=torch.Generator(device=out.device).manual_seed(1), device=out.device,
                       dtype=out.dtype)
    grad = lambda _: torch.autograd.grad(out, leaves, dout, retain_graph=True)  # noqa: E731
    return median_ms(grad, [None]), grad(None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pass", dest="which", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--headdims", default="64,128")
    ap.add_argument("--means", default="512,2048")
    ap.add_argument("--providers", default="gluon,portable,sdpa-njt")
    args = ap.parse_args()
    backward = args.which == "bwd"
    providers = args.providers.split(",")
    os.makedirs(args.out, exist_ok=True)
    sink = open(os.path.join(args.out, "ab_varlen_bwd.jsonl" if backward else "ab_varlen.jsonl"), "w")
    hopper.GLUON_VARLEN = True
    print(f"{args.which}: TFLOP/s")
    print(f"{'d':>3} {'c':>1} {'mean':>5} {'seqs':>4} {'max':>5} " + " ".join(f"{p:>9}" for p in providers)
          + f" {'g/port':>6} {'g/peer':>6}")
    for d in map(int, args.headdims.split(",")):
        h = HIDDEN // d
        for mean in map(int, args.means.split(",")):
            lens = lengths(mean)
            cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
            total, max_len = sum(lens), max(lens)
            q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (False, True):
                flops = sum(4 * h * n * n * d for n in lens) / (2 if causal else 1) * (2.5 if backward else 1)
                res, outs, notes = {}, {}, []
                for name in providers:
                    rec = dict(pass_=args.which, headdim=d, causal=causal, mean=mean, seqs=len(lens), tokens=total,
                               max_seqlen=max_len, provider=name)
                    try:
                        rec["kernel"] = _kernel(name, q, k, v, cu, max_len, causal, backward)
                        ms, outs[name] = measure(name, q, k, v, cu, max_len, causal, backward)
                        res[name] = flops / ms / 1e9
                        rec.update(ms=ms, tflops=res[name])
                    except Exception as e:  # noqa: BLE001 - a peer may not run here; recorded, not fatal
                        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        notes.append(f"{name}: {rec['error'][:80]}")
                    sink.write(json.dumps({k_.rstrip("_"): v_ for k_, v_ in rec.items()}) + "\n")
                    sink.flush()
                ok = True
                for name, o in outs.items():
                    pieces = o if backward else (o,)
                    ok &= all(bool(torch.isfinite(t).all()) for t in pieces)
                    if "portable" in outs and name != "portable":
                        ref = outs["portable"] if backward else (outs["portable"],)
                        ok &= max((a.float() - b.float()).abs().max().item() for a, b in zip(pieces, ref)) < 0.05
                cells = " ".join(f"{res[p]:9.0f}" if p in res else f"{'-':>9}" for p in providers)
                ratio = lambda a, b: f"{res[a] / res[b]:6.2f}" if a in res and b in res else f"{'-':>6}"  # noqa: E731
                print(f"{d:>3} {int(causal):>1} {mean:>5} {len(lens):>4} {max_len:>5} {cells} "
                      f"{ratio('gluon', 'portable')} {ratio('gluon', 'sdpa-njt')}{'' if ok else ' MISMATCH'}"
                      + ("  [" + "; ".join(notes) + "]" if notes else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
