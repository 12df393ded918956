"""``ioattn bench fp4-study``: P in FP4 before P V (FlashAttention-4's inference idea), in emulation.

The unnormalised probabilities P = exp(s - m) go through bf16, FP8 (e4m3, scaled by ``P_SCALE``),
MXFP4 or NVFP4 (``ioattn.reference.fp4``) before the P V product; scores, V and the row sums stay
float64. Two input sets:

* ``fa3-outliers``: the scores q kᵀ / sqrt(d) and V of ``fp8_accuracy.outlier_inputs``;
* ``heavy-tailed``: synthetic scores shaped like a trained model's rows (``heavy_tailed_scores``):
  a Student-t bulk at a per-row temperature, and "sink" keys that hold from 5 % to 98 % of a row's mass.

Errors against float64 softmax(s) V: the RMSE, and the worst row's error (the largest, over the
query rows, of the row's error norm over its output norm; and of its largest absolute error).
"""
from __future__ import annotations

import math

import torch

from ioattn.bench import fp8_accuracy as fa
from ioattn.reference.fp4 import MX_BLOCK, NVFP4_BLOCK, P_FORMATS, attention_quantised_p
from ioattn.reference.fp8 import P_SCALE
from ioattn.reference.naive import scores_ref

NAME = "fp4-study"
HELP = ("P quantised to FP4 (MXFP4, NVFP4) before P V against FP8 and bf16 P: RMSE and worst row "
        "(float64 emulation; no GPU needed)")
F64 = torch.float64
INPUTS = ("fa3-outliers", "heavy-tailed")
# the heavy-tailed rows: Student-t bulk with NU degrees of freedom, times a per-row temperature drawn
# log-uniformly from TEMPERATURE; the first SINKS keys share a fraction sigmoid(offset) of the row's
# mass, the offset drawn per (batch, head) uniformly from SINK_OFFSET (shares from 5 % to 98 %)
NU = 4
TEMPERATURE = (0.3, 2.5)
SINKS = 4
SINK_OFFSET = (-3.0, 4.0)


def heavy_tailed_scores(batch, heads, seqlen, seed):
    """Synthetic attention logits (batch, heads, seqlen, seqlen), float64, deterministic from ``seed``.
    Each row's bulk is Student-t with ``NU`` degrees of freedom (normal / sqrt(chi² / NU): a few keys
    far above the rest), times the row's temperature, log-uniform in ``TEMPERATURE`` (from broad rows
    to rows held by a handful of keys). Keys 0 to ``SINKS`` - 1 are attention sinks: their logits are
    the logsumexp of the row's other keys plus an offset drawn once per (batch, head) from
    ``SINK_OFFSET``, minus log(SINKS), plus a N(0, 0.5²) jitter, so the sinks hold about
    sigmoid(offset) of the row's mass (more in causal rows, which see fewer of the other keys)."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, heads, seqlen, seqlen)
    z = torch.randn(shape, dtype=F64, generator=g)
    chi2 = sum(torch.randn(shape, dtype=F64, generator=g).pow(2) for _ in range(NU))
    lo, hi = math.log(TEMPERATURE[0]), math.log(TEMPERATURE[1])
    temp = torch.exp(lo + (hi - lo) * torch.rand(batch, heads, seqlen, 1, dtype=F64, generator=g))
    s = z / (chi2 / NU).sqrt() * temp
    lo, hi = SINK_OFFSET
    offset = lo + (hi - lo) * torch.rand(batch, heads, 1, 1, dtype=F64, generator=g)
    jitter = 0.5 * torch.randn(batch, heads, seqlen, SINKS, dtype=F64, generator=g)
    rest = torch.logsumexp(s[..., SINKS:], dim=-1, keepdim=True)
    s[..., :SINKS] = rest + offset - math.log(SINKS) + jitter
    return s


def problem(inputs, batch, heads, seqlen, headdim, seed, causal, outlier_prob=fa.OUTLIER_PROB):
    """(scores (batch, heads, seqlen, seqlen) with masked entries -inf, v (batch, seqlen, heads,
    headdim)) of input set ``inputs``, float64, deterministic from ``seed``."""
    window = (-1, 0) if causal else (-1, -1)
    if inputs == "fa3-outliers":
        q, k, v = fa.outlier_inputs(batch, heads, seqlen, headdim, seed, outlier_prob)
        return scores_ref(q, k, headdim ** -0.5, window), v
    if inputs != "heavy-tailed":
        raise ValueError(f"inputs must be one of {INPUTS}, got {inputs!r}")
    s = heavy_tailed_scores(batch, heads, seqlen, seed)
    if causal:
        s = s.masked_fill(torch.ones(seqlen, seqlen, dtype=torch.bool).triu(1), float("-inf"))
    v = torch.randn(batch, seqlen, heads, headdim, dtype=F64, generator=torch.Generator().manual_seed(seed + 1))
    return s, v


def errors(out, ref):
    """(RMSE, worst row's error norm / its output norm, worst row's largest absolute error)."""
    e = out - ref
    rel = e.norm(dim=-1) / ref.norm(dim=-1).clamp(min=torch.finfo(F64).tiny)
    return e.pow(2).mean().sqrt().item(), rel.max().item(), e.abs().max().item()


def _params(inputs, outlier_prob):
    """The construction's parameters, for the records."""
    if inputs == "fa3-outliers":
        return dict(outlier_prob=outlier_prob, outlier_std=fa.OUTLIER_STD)
    return dict(nu=NU, temperature=list(TEMPERATURE), sinks=SINKS, sink_offset=list(SINK_OFFSET))


def study(batch, heads, seqlen, headdim, seeds, outlier_prob=fa.OUTLIER_PROB, formats=P_FORMATS, log=print):
    """One record per (seed, inputs, causal, P format) with every parameter and the three errors."""
    records = []
    for seed in seeds:
        for inputs in INPUTS:
            for causal in (False, True):
                s, v = problem(inputs, batch, heads, seqlen, headdim, seed, causal, outlier_prob)
                ref = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)
                ref_rms = ref.pow(2).mean().sqrt().item()
                for fmt in formats:
                    rmse, worst_rel, worst_abs = errors(attention_quantised_p(s, v, fmt), ref)
                    records.append(dict(study=NAME, inputs=inputs, p_format=fmt, batch=batch, heads=heads,
                                        seqlen=seqlen, headdim=headdim, causal=causal, seed=seed, rmse=rmse,
                                        worst_row_rel=worst_rel, worst_row_abs=worst_abs, ref_rms=ref_rms, p_scale=P_SCALE,
                                        mx_block=MX_BLOCK, nvfp4_block=NVFP4_BLOCK, **_params(inputs, outlier_prob)))
                log(f"seed {seed}, {inputs}, {'causal' if causal else 'not causal'}: done")
    return records


def summary(records):
    """{(inputs, causal, format): (pooled RMSE, worst row rel over the seeds, worst abs over the seeds)}."""
    acc = {}
    for r in records:
        acc.setdefault((r["inputs"], r["causal"], r["p_format"]), []).append(r)
    return {key: (math.sqrt(sum(r["rmse"] ** 2 for r in rs) / len(rs)), max(r["worst_row_rel"] for r in rs),
                  max(r["worst_row_abs"] for r in rs)) for key, rs in acc.items()}


def table(records):
    """One block per input set: a line per P format, its errors not causal and causal."""
    got, out = summary(records), []
    cols = ["P format", "RMSE", "worst row rel", "worst abs", "RMSE causal", "worst row rel causal", "worst abs causal"]
    for inputs in dict.fromkeys(r["inputs"] for r in records):
        lines = [[fmt] + [fa._fmt(x) for causal in (False, True) for x in got.get((inputs, causal, fmt), (None,) * 3)]
                 for fmt in dict.fromkeys(r["p_format"] for r in records)]
        widths = [max(len(c), *(len(ln[i]) for ln in lines)) for i, c in enumerate(cols)]
        rms = [r["ref_rms"] for r in records if r["inputs"] == inputs]
        out.append(f"== {inputs} (the exact output's RMS: {math.sqrt(sum(x * x for x in rms) / len(rms)):.3f}) ==")
        out += ["  ".join(s.rjust(w) if i else s.ljust(w) for i, (s, w) in enumerate(zip(ln, widths)))
                for ln in [cols] + lines]
    return "\n".join(out)


def plot(records, out_dir):
    """``fp4_study.png``: pooled RMSE and worst-row relative error per P format, one panel per (input
    set, metric), not causal and causal side by side."""
    import os

    got = summary(records)
    fmts = list(dict.fromkeys(r["p_format"] for r in records))
    panels = {}
    for inputs in dict.fromkeys(r["inputs"] for r in records):
        for i, metric in enumerate(("RMSE", "worst row rel. error")):
            panels[f"{inputs}: {metric}"] = {
                name: [(f, got[(inputs, causal, f)][i]) for f in fmts if (inputs, causal, f) in got]
                for causal, name in ((False, "not causal"), (True, "causal"))}
    r0 = records[0]
    title = f"P through each format before P V, N={r0['seqlen']}, d={r0['headdim']} (float64 emulation)"
    return fa.bar_plot(panels, os.path.join(out_dir, "fp4_study.png"), title, "error", ncols=2)


def add_arguments(parser):
    return fa.add_shape_arguments(parser, rotation=False)


def run(args):
    """``ioattn bench fp4-study``; exit status 0 unless an error is not finite."""
    print(fa.heading(args.batch, args.heads, args.seqlen, args.headdim, args.seeds,
                     "FP4 Direct-P study, P through each format before P V (float64 emulation)"))
    records = study(args.batch, args.heads, args.seqlen, args.headdim, args.seeds, args.outlier_prob)
    print()
    print(table(records))
    fa.write(records, args, plot)
    finite = all(math.isfinite(r[k]) for r in records for k in ("rmse", "worst_row_rel", "worst_row_abs"))
    return 0 if finite else 1


REQUIRED = {"study": str, "inputs": str, "p_format": str, "rmse": float, "worst_row_rel": float,
            "worst_row_abs": float, "ref_rms": float, "batch": int, "heads": int, "seqlen": int, "headdim": int, "causal": bool,
            "seed": int, "command": str, "env": dict}


def validate(record):
    return fa.validate(record, REQUIRED)
