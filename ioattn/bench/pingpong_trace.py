"""``ioattn bench pingpong-trace``: the Gluon forward's ping-pong schedule, recorded by the kernel itself.

One launch of the one-tile ping-pong kernel with its schedule record (``Trace``): each consumer
warpgroup stamps the SM's cycle counter when it takes its turn (its GEMMs issued), when S is ready,
when its softmax is done and when its P V is done, at every critical section
(``kernels.hopper_fwd_tile._stamp``). The record's output is checked against the untraced call. The
JSON (``--out``) holds the first ``--programs`` CTAs' stamps in cycles from the CTA's first stamp,
the device and the plan: the data of the explainer's ping-pong page. The stamps are a separate build
(a clock read and a store each): indicative of the schedule, not of the untraced kernel's time.
``--fp8``: the FP8 forward's schedule, on the inputs quantised per head (``quantize_fp8_ref``).
"""
from __future__ import annotations

import json

import torch

NAME = "pingpong-trace"
HELP = ("the Gluon forward's ping-pong schedule as the kernel records it (clock stamps per warpgroup and "
        "critical section), for the explainer's timeline [needs an sm_90 GPU]")
EVENTS = ("turn", "s_ready", "softmax_done", "pv_done")


def add_arguments(parser):
    parser.add_argument("--seqlen", type=int, default=4096, help="query and key length (default: 4096)")
    parser.add_argument("--headdim", type=int, default=128, help="head dim (default: 128)")
    parser.add_argument("--nheads", type=int, default=16, help="heads (default: 16)")
    parser.add_argument("--causal", action="store_true", help="the causal mask (default: off)")
    parser.add_argument("--fp8", action="store_true", help="the FP8 (e4m3) forward, inputs quantised per head (default: bf16)")
    parser.add_argument("--programs", type=int, default=4, help="CTAs written out (default: 4)")
    parser.add_argument("--out", default=None, help="the JSON file (default: none, a summary printed only)")
    return parser


def record(seqlen, headdim, nheads, causal, programs, fp8=False):
    """The schedule record of one call as a dict (see the module's docstring)."""
    import ioattn
    from ioattn import backends
    from ioattn.fp8 import descale_rows
    from ioattn.launch.gluon_fwd import schedule_trace
    from ioattn.plan import forward as forward_plan, hopper
    from ioattn.reference.fp8 import quantize_fp8_ref

    g = torch.Generator(device="cuda").manual_seed(seqlen + headdim)
    q, k, v = (torch.randn(1, seqlen, nheads, headdim, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    kw, descales = {}, None
    if fp8:
        (q, qs), (k, ks), (v, vs) = (quantize_fp8_ref(t, "head") for t in (q, k, v))
        kw = dict(q_descale=qs, k_descale=ks, v_descale=vs)
        descales = descale_rows(qs, ks, vs, 1, nheads, nheads, q.device)
    with hopper.variant("pingpong"):  # the one-tile kernel (the persistent one walks several tiles a program)
        plan = forward_plan.plan_forward(backends.forward_signature(q, k, headdim ** -0.5, causal))
    out, _, stamps = schedule_trace(plan, q, k, v, descales)
    err = (out.float() - ioattn.flash_attn_func(q, k, v, causal=causal, **kw).float()).abs().max().item()
    ctas = []
    for p in range(min(programs, stamps.shape[0])):
        s = stamps[p].cpu()
        t0 = int(s[s >= 0].min())
        ctas.append([[[int(x) - t0 if x >= 0 else None for x in sec] for sec in wg] for wg in s])
    props = torch.cuda.get_device_properties(0)
    return dict(device=props.name, sm_count=props.multi_processor_count, seqlen=seqlen, headdim=headdim,
                nheads=nheads, causal=causal, dtype="e4m3" if fp8 else "bf16", variant=plan.variant, block_m=plan.block_m, block_n=plan.block_n,
                num_wg=dict(plan.constexprs)["NUM_WG"], events=list(EVENTS), unit="cycles",
                max_diff_untraced=err, ctas=ctas)


def run(args):
    """``ioattn bench pingpong-trace``; exit status 0 when the traced output equals the untraced one."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("ioattn bench pingpong-trace needs an sm_90 GPU (the Gluon kernels)")
        return 1
    try:
        rec = record(args.seqlen, args.headdim, args.nheads, args.causal, args.programs, args.fp8)
    except ValueError as e:  # the plan is not a one-tile ping-pong one at this shape
        print(f"ioattn bench pingpong-trace: {e}")
        return 1
    rec["command"] = "ioattn " + " ".join(args.argv)
    cta = rec["ctas"][0]
    for w, wg in enumerate(cta):
        spans = [sec[2] - sec[1] for sec in wg if sec[1] is not None and sec[2] is not None]
        print(f"{rec['variant']} warpgroup {w}: {len(wg)} sections, softmax median "
              f"{sorted(spans)[len(spans) // 2] if spans else 0} cycles, last P V done at {wg[-1][3]} cycles")
    print(f"traced output vs untraced: max |diff| {rec['max_diff_untraced']:.2e}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rec, f)
    return 0 if rec["max_diff_untraced"] == 0.0 else 1
