"""``ioattn bench fp8-accuracy``: the RMS error of FP8 attention recipes on FlashAttention-3's inputs.

q, k, v are N(0, 1) plus, with probability 0.001 per element, an added N(0, 10²) outlier (the
FlashAttention-3 paper, section 4.3), in float64; every row is compared with float64 attention of
these unquantised inputs. A row is "how to quantise" (a ``Recipe``: granularity, the shared
rotation, P's scale) plus "how to run the attention" (a ``Runner``: the float64 emulations of
``ioattn.reference.fp8``, the bf16 ``flash_attn_func`` or ioattn's FP8 kernel); ``measure`` computes
any list of rows, and a row whose runner cannot take its recipe is skipped with the reason. The
baseline is FA3's: standard attention in FP8, per tensor, its normalised P converted to e4m3 as it
comes.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Callable

import torch

from ioattn.bench.arg_types import int_list, positive_int, probability
from ioattn.reference.fp8 import (P_SCALE, attention_fp8_ref, dequantize_fp8_ref, quantize_fp8_ref, quantize_p,
                                  random_signs, rotate)
from ioattn.reference.naive import attention_ref, scores_ref

NAME = "fp8-accuracy"
HELP = ("FP8 attention's RMS error on FlashAttention-3's outlier inputs, per quantisation recipe "
        "(float64 emulation; no GPU needed)")
F64 = torch.float64
OUTLIER_PROB, OUTLIER_STD = 0.001, 10.0
DEFAULTS = dict(batch=2, heads=4, seqlen=1024, headdim=128, seeds=(0, 1, 2, 3, 4))
TARGET = 2.6  # the project's goal: per-block FP8 with the rotation this many times below the baseline


@dataclass(frozen=True)
class Recipe:
    """How q, k, v become FP8: scales per ``granularity`` ("tensor", "head" or "block" of
    ``block_rows`` rows), q and k rotated first (``rotate``: FA3's incoherent processing, one random
    sign vector shared by both), P multiplied by ``p_scale`` before its e4m3 conversion (1: as it comes)."""
    granularity: str
    p_scale: float = P_SCALE
    rotate: bool = False
    block_rows: int = 128


@dataclass(frozen=True)
class Fp8Inputs:
    """e4m3 q, k, v and the descales that undo them (``quantize_fp8_ref``'s shapes)."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor


@dataclass(frozen=True)
class Runner:
    """How to run the attention: ``run(inputs, recipe, causal)`` returns the output (batch, seqlen,
    heads, d), given ``Fp8Inputs`` for a recipe, else the float64 (q, k, v); ``why_not(recipe)`` is
    None where it can take that recipe, else the reason; ``how()`` names what runs, for the table."""
    run: Callable
    how: Callable
    why_not: Callable = lambda recipe: None
    emulation: bool = True


@dataclass(frozen=True)
class Row:
    """One line of the study: its name, its runner's key in ``RUNNERS`` and its recipe (None: the
    runner gets the inputs unquantised)."""
    name: str
    runner: str
    recipe: Recipe | None = None


def _fp8_reference(x, recipe, causal):
    return attention_fp8_ref(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, causal=causal,
                             p_scale=recipe.p_scale, block_rows=recipe.block_rows)


def _fp8_standard(x, recipe, causal):
    """Standard attention in FP8 (FA3's baseline): the normalised softmax, whose entries sit near 1/N,
    converted to e4m3 as it comes (times ``p_scale``), then P V; float64 otherwise."""
    q, k, v = (dequantize_fp8_ref(t, s, recipe.block_rows) for t, s in
               ((x.q, x.q_descale), (x.k, x.k_descale), (x.v, x.v_descale)))
    s = scores_ref(q, k, q.shape[-1] ** -0.5, (-1, 0) if causal else (-1, -1))
    p = torch.softmax(s, dim=-1).nan_to_num(nan=0.0)
    return torch.einsum("bhqk,bkhd->bqhd", quantize_p(p, recipe.p_scale), v)


def _bf16_device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _bf16_kernel(qkv, recipe, causal):
    from ioattn import flash_attn_func

    q, k, v = (t.to(device=_bf16_device(), dtype=torch.bfloat16) for t in qkv)
    return flash_attn_func(q, k, v, causal=causal).to(device="cpu", dtype=F64)


def _bf16_why_not(recipe):
    """None where this machine can run bf16 ``flash_attn_func``; else the interpreter's refusal."""
    from ioattn._compat import InterpreterUnsupportedError
    from ioattn.plan import dispatch

    try:
        dispatch.use_triton(torch.device(_bf16_device()), torch.bfloat16)
    except InterpreterUnsupportedError as e:
        return str(e)
    return None


def _bf16_how():
    from ioattn.plan import dispatch

    device = torch.device(_bf16_device())
    if not dispatch.use_triton(device):
        return "ioattn CPU path, bf16"
    return "ioattn Triton interpreter, bf16" if dispatch.interpreting(device) else "ioattn GPU kernel, bf16"


def _fp8_kernel(x, recipe, causal):
    """ioattn's FP8 forward on the recipe's e4m3 inputs and descales (bf16 out)."""
    from ioattn import flash_attn_func

    device = _bf16_device()
    q, k, v, qs, ks, vs = (t.to(device) for t in (x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale))
    return flash_attn_func(q, k, v, causal=causal, q_descale=qs, k_descale=ks,
                           v_descale=vs).to(device="cpu", dtype=F64)


def _fp8_kernel_why_not(recipe):
    """None where ioattn's FP8 kernels can run this recipe here, else why not."""
    from ioattn._compat import InterpreterUnsupportedError
    from ioattn.plan import dispatch

    if recipe.granularity == "block":
        return "the FP8 kernels take one descale per (batch, head)"
    if recipe.p_scale != P_SCALE:
        return f"the FP8 kernels scale P by P_SCALE ({P_SCALE:g})"
    device = torch.device(_bf16_device())
    try:
        if not dispatch.use_triton(device, torch.float8_e4m3fn):
            return "no FP8 kernel on the CPU path (it dequantises): a GPU or TRITON_INTERPRET=1"
    except InterpreterUnsupportedError as e:
        return str(e)
    return None


def _fp8_kernel_how():
    from ioattn.plan import dispatch

    device = torch.device(_bf16_device())
    return "ioattn FP8 kernel, Triton interpreter" if dispatch.interpreting(device) else "ioattn FP8 kernel, GPU"


RUNNERS = {
    "bf16": Runner(_bf16_kernel, _bf16_how, _bf16_why_not, emulation=False),
    "fp8-kernel": Runner(_fp8_kernel, _fp8_kernel_how, _fp8_kernel_why_not, emulation=False),
    "fp8-reference": Runner(_fp8_reference, lambda: "FP8 emulation (reference.fp8)"),
    "fp8-standard": Runner(_fp8_standard, lambda: "FP8 emulation, standard attention"),
}
BASELINE = "tensor, standard attention, P as is"
ROWS = (
    Row("bf16", "bf16"),
    Row(BASELINE, "fp8-standard", Recipe("tensor", p_scale=1.0)),
    Row("tensor, P as is", "fp8-reference", Recipe("tensor", p_scale=1.0)),
    Row("tensor, P scaled", "fp8-reference", Recipe("tensor")),
    Row("head, P scaled", "fp8-reference", Recipe("head")),
    Row("block, P scaled", "fp8-reference", Recipe("block")),
    Row("tensor + rotation, P scaled", "fp8-reference", Recipe("tensor", rotate=True)),
    Row("head + rotation, P scaled", "fp8-reference", Recipe("head", rotate=True)),
    Row("block + rotation, P scaled", "fp8-reference", Recipe("block", rotate=True)),
    Row("kernel: head, P scaled", "fp8-kernel", Recipe("head")),
    Row("kernel: head + rotation, P scaled", "fp8-kernel", Recipe("head", rotate=True)),
)
TARGET_ROW = "block + rotation, P scaled"


def outlier_inputs(batch, heads, seqlen, headdim, seed, prob=OUTLIER_PROB):
    """FA3's q, k, v (batch, seqlen, heads, headdim), float64: N(0, 1) plus, with probability
    ``prob`` per element, an added N(0, OUTLIER_STD²); deterministic from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, seqlen, heads, headdim)

    def draw():
        x = torch.randn(shape, dtype=F64, generator=g)
        hit = torch.rand(shape, dtype=F64, generator=g) < prob
        return x + hit * torch.randn(shape, dtype=F64, generator=g) * OUTLIER_STD
    return draw(), draw(), draw()


def quantise(recipe, q, k, v, signs):
    """``Fp8Inputs`` of q, k, v by ``recipe``; q and k rotated by ``signs`` first where it says so."""
    if recipe.rotate:
        q, k = rotate(q, signs), rotate(k, signs)
    (q8, qs), (k8, ks), (v8, vs) = (quantize_fp8_ref(t, recipe.granularity, recipe.block_rows) for t in (q, k, v))
    return Fp8Inputs(q8, k8, v8, qs, ks, vs)


def rmse(out, ref):
    return (out.to(F64) - ref).pow(2).mean().sqrt().item()


def measure(rows, q, k, v, causal, signs, runners=None):
    """One dict per row (row, runner, how, emulation, rmse, ref_rms, note): the row's recipe applied
    to the float64 q, k, v, its runner's output against float64 attention of q, k, v (whose RMS is
    ref_rms). A row whose runner is missing or refuses its recipe has rmse None and the reason in
    ``note``."""
    runners = RUNNERS if runners is None else runners
    ref = attention_ref(q, k, v, window=(-1, 0) if causal else (-1, -1))[0]
    ref_rms = ref.pow(2).mean().sqrt().item()
    out = []
    for row in rows:
        runner = runners.get(row.runner)
        why = f"no runner {row.runner!r} here" if runner is None else runner.why_not(row.recipe)
        res = dict(row=row.name, runner=row.runner, rmse=None, ref_rms=ref_rms, note=why)
        if why is None:
            inputs = quantise(row.recipe, q, k, v, signs) if row.recipe else (q, k, v)
            res.update(how=runner.how(), emulation=runner.emulation,
                       rmse=rmse(runner.run(inputs, row.recipe, causal), ref))
        out.append(res)
    return out


def _recipe_fields(recipe):
    if recipe is None:
        return dict(granularity=None, p_scale=None, rotation=False, block_rows=None)
    return dict(granularity=recipe.granularity, p_scale=recipe.p_scale, rotation=recipe.rotate,
                block_rows=recipe.block_rows if recipe.granularity == "block" else None)


def study(batch, heads, seqlen, headdim, seeds, outlier_prob=OUTLIER_PROB, rows=ROWS, runners=None, log=print):
    """Every row, not causal and causal, for each seed: one record per (seed, causal, row) with every
    parameter, its RMSE and its ratio to the baseline's (same seed and causal)."""
    records = []
    recipes = {r.name: r.recipe for r in rows}
    for seed in seeds:
        q, k, v = outlier_inputs(batch, heads, seqlen, headdim, seed, outlier_prob)
        signs = random_signs(headdim, seed + 1)
        for causal in (False, True):
            got = measure(rows, q, k, v, causal, signs, runners)
            base = next((r["rmse"] for r in got if r["row"] == BASELINE), None)
            for r in got:
                r.update(study=NAME, batch=batch, heads=heads, seqlen=seqlen, headdim=headdim, causal=causal,
                         seed=seed, signs_seed=seed + 1, outlier_prob=outlier_prob, outlier_std=OUTLIER_STD,
                         ratio=r["rmse"] / base if r["rmse"] is not None and base else None,
                         **_recipe_fields(recipes[r["row"]]))
                records.append(r)
            log(f"seed {seed}, {'causal' if causal else 'not causal'}: done")
    return records


def pooled(records, key="rmse"):
    """{(row, causal): the RMS over the seeds of ``key``} (equal-sized draws: the pooled RMSE)."""
    acc = {}
    for r in records:
        if r.get(key) is not None:
            acc.setdefault((r["row"], r["causal"]), []).append(r[key])
    return {k: (sum(x * x for x in xs) / len(xs)) ** 0.5 for k, xs in acc.items()}


def _fmt(x, spec=".2e"):
    return "-" if x is None else format(x, spec)


def table(records):
    """The rows in study order: how each ran, its pooled RMSE and its ratio to the baseline's, not
    causal and causal; then the notes of skipped rows."""
    rms = pooled(records)
    names = list(dict.fromkeys(r["row"] for r in records))
    how = {r["row"]: r.get("how") or "skipped" for r in records}
    cols = ["row", "how it ran", "RMSE not causal", "ratio", "RMSE causal", "ratio"]
    lines = []
    for name in names:
        cells = [name, how[name]]
        for causal in (False, True):
            x, b = rms.get((name, causal)), rms.get((BASELINE, causal))
            cells += [_fmt(x), _fmt(x / b if x is not None and b else None, ".3f")]
        lines.append(cells)
    widths = [max(len(c), *(len(ln[i]) for ln in lines)) for i, c in enumerate(cols)]
    out = ["  ".join(s.ljust(w) if i < 2 else s.rjust(w) for i, (s, w) in enumerate(zip(ln, widths)))
           for ln in [cols] + lines]
    notes = dict.fromkeys(f"  {r['row']}: skipped: {r['note']}" for r in records if r.get("note"))
    return "\n".join(out + list(notes))


def target_lines(records):
    """Per causal setting: the target row's RMSE reduction against the baseline (pooled, and its
    range over the seeds), and whether it reaches ``TARGET``."""
    rms, lines = pooled(records), []
    for causal in (False, True):
        base, best = rms.get((BASELINE, causal)), rms.get((TARGET_ROW, causal))
        if not base or not best:
            continue
        per = [1 / r["ratio"] for r in records if r["row"] == TARGET_ROW and r["causal"] == causal and r["ratio"]]
        verdict = "met" if base / best >= TARGET else "NOT met"
        lines.append(f"target ({'causal' if causal else 'not causal'}): {TARGET_ROW} {base / best:.2f}x below the "
                     f"baseline (per seed {min(per):.2f}-{max(per):.2f}x); goal {TARGET}x: {verdict}")
    return lines


def heading(batch, heads, seqlen, headdim, seeds, what):
    seeds = ",".join(map(str, seeds))
    return (f"{what}: batch {batch}, heads {heads}, seqlen {seqlen}, head dim {headdim}, seeds {seeds}; "
            "RMSE against float64 attention of the unquantised inputs, pooled over the seeds")


def bar_plot(panels, path, title, xlabel, marks=None, ncols=None):
    """A PNG of horizontal bars, log x: ``panels`` {panel title: {series: [(label, value), ...]}}, the
    bars of each label grouped, ``ncols`` panels to a row (default: all); ``marks`` {panel title:
    (x, text)} draws a dashed line there."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = list(dict.fromkeys(lab for series in panels.values() for pts in series.values() for lab, _ in pts))
    ncols = ncols or len(panels)
    nrows = -(-len(panels) // ncols)
    fig = Figure(figsize=(5.5 * ncols + 2.0, nrows * (0.42 * len(labels) + 1.4) + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    for i, (ptitle, series) in enumerate(panels.items()):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        height = 0.8 / len(series)
        for j, (sname, pts) in enumerate(series.items()):
            ys = [labels.index(lab) + (j - (len(series) - 1) / 2) * height for lab, _ in pts]
            bars = ax.barh(ys, [x for _, x in pts], height=height, label=sname, color=f"C{j}")
            ax.bar_label(bars, fmt="%.2g", fontsize="x-small", padding=2)
        if marks and ptitle in marks:
            x, text = marks[ptitle]
            ax.axvline(x, color="black", linestyle="--", linewidth=1, label=text)
        ax.set_yticks(range(len(labels)), labels if i % ncols == 0 else [""] * len(labels))
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_title(ptitle)
        ax.set_xlabel(xlabel)
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.savefig(path, dpi=90)
    return path


def plot(records, out_dir):
    """``fp8_accuracy.png``: pooled RMSE per row, not causal and causal, the target's line drawn at
    the baseline's RMSE / ``TARGET``."""
    rms = pooled(records)
    names = list(dict.fromkeys(r["row"] for r in records))
    panels, marks = {}, {}
    for causal in (False, True):
        title = "causal" if causal else "not causal"
        pts = [(n, rms[(n, causal)]) for n in names if (n, causal) in rms]
        panels[title] = {"RMSE": pts}
        if (BASELINE, causal) in rms:
            marks[title] = (rms[(BASELINE, causal)] / TARGET, f"baseline / {TARGET}")
    r0 = records[0]
    what = f"FP8 attention RMSE, FA3 outlier inputs, N={r0['seqlen']}, d={r0['headdim']} (float64 emulation)"
    return bar_plot(panels, os.path.join(out_dir, "fp8_accuracy.png"), what, "RMSE", marks=marks)


def add_shape_arguments(parser, rotation=True):
    """The options both accuracy studies take (each help names its default); ``rotation``: the head
    dim must be a power of two (``check_shape``)."""
    dim = "head dim, a power of two (the Hadamard rotation)" if rotation else "head dim"
    for flag, what in (("--batch", "batch size"), ("--heads", "heads"),
                       ("--seqlen", "sequence length (queries and keys)"), ("--headdim", dim)):
        key = flag[2:]
        parser.add_argument(flag, type=positive_int, default=DEFAULTS[key], metavar="N",
                            help=f"{what} (default: {DEFAULTS[key]})")
    parser.add_argument("--seeds", type=int_list(0), default=list(DEFAULTS["seeds"]), metavar="S,S",
                        help="comma-separated seeds, one draw of the inputs each, the RMSE pooled over them "
                        f"(default: {','.join(map(str, DEFAULTS['seeds']))})")
    parser.add_argument("--outlier-prob", type=probability, default=OUTLIER_PROB, metavar="P",
                        help="probability per element of q, k, v of an added N(0, 10^2) outlier "
                        f"(default: {OUTLIER_PROB}, FlashAttention-3's)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="directory for results.jsonl and the plot (default: none, nothing is written)")
    return parser


def check_shape(args):
    """Refuse a head dim the rotation cannot take, naming the option and the value."""
    d = args.headdim
    if d & (d - 1):
        args.parser.error(f"--headdim must be a power of two (the Hadamard rotation), got {d}")


add_arguments = add_shape_arguments


def write(records, args, plot_fn):
    """Each record gets the command and the environment; with ``--out``: results.jsonl and the plot
    (a message instead where matplotlib is missing)."""
    from ioattn.bench.run import environment

    env, command = environment(), "ioattn " + " ".join(getattr(args, "argv", []))
    for r in records:
        r.update(command=command, env=env)
    if not args.out:
        return
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    print(f"\nwrote {len(records)} records to {path}")
    try:
        print(f"wrote {plot_fn(records, args.out)}")
    except ImportError:  # matplotlib is the optional [bench] extra; the JSON is what matters
        print("no plot: matplotlib is not installed (pip install 'ioattn[bench]')")


def run(args):
    """``ioattn bench fp8-accuracy``; exit status 0 unless a measured RMSE is not finite."""
    check_shape(args)
    print(heading(args.batch, args.heads, args.seqlen, args.headdim, args.seeds,
                  f"FP8 accuracy, q, k, v ~ N(0,1) + Bernoulli({args.outlier_prob}) x N(0, {OUTLIER_STD:g}^2)"))
    print("(the FP8 rows are float64 emulation, the same on any device; the bf16 row is what ran here)")
    records = study(args.batch, args.heads, args.seqlen, args.headdim, args.seeds, args.outlier_prob)
    print()
    print(table(records))
    exact, first = pooled(records, "ref_rms"), records[0]["row"]  # the same for every row
    print(f"the exact output's RMS: not causal {exact[(first, False)]:.3f}, causal {exact[(first, True)]:.3f}")
    for line in target_lines(records):
        print(line)
    write(records, args, plot)
    return 0 if all(r["rmse"] is None or math.isfinite(r["rmse"]) for r in records) else 1


REQUIRED = {"study": str, "row": str, "runner": str, "rmse": (float, type(None)), "ratio": (float, type(None)),
            "ref_rms": float,
            "batch": int, "heads": int, "seqlen": int, "headdim": int, "causal": bool, "seed": int,
            "command": str, "env": dict}


def validate(record, required=None):
    """The schema problems of one record (empty: fine)."""
    required = REQUIRED if required is None else required
    problems = [f"missing {k}" for k in required if k not in record]
    problems += [f"{k} is {type(record[k]).__name__}" for k, t in required.items()
                 if k in record and not isinstance(record[k], t)]
    return problems
