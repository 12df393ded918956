"""``ioattn io``: the IO model of attention (``ioattn.reference.io_model``) as a table or one JSON object.

For standard attention, FlashAttention-1, FlashAttention-2 and the compulsory traffic (``minimum``),
forward and backward: predicted HBM bytes, their ratio to standard attention, FLOPs, arithmetic
intensity and the time lower bound max(bytes / bandwidth, FLOPs / peak) on the chosen device. The
table's columns are read from the JSON rows (``COLUMNS``), so a measured column is one more entry.
"""
from __future__ import annotations

import json
import os
import sys

from ioattn.bench.arg_types import int_list
from ioattn.reference.io_model import DEVICES, ELEMENT_BYTES, KB, MIB, ModelArgumentError, Problem, predict

NAME = "io"
HELP = ("the IO model of attention: predicted HBM bytes, FLOPs and time lower bound of standard attention, "
        "FlashAttention-1 and -2, forward and backward (no GPU needed)")
DESCRIPTION = (HELP[0].upper() + HELP[1:] + ". Every load and store is counted as an HBM access (no cache): "
               "docs/io-model.md states the terms and where measured bytes differ.")
DEFAULT_DEVICE = "h100"
# the model's argument names that are not the option's name with its underscores as hyphens
FLAGS = {"seqlen_q": "--seqlen"}


def add_arguments(parser):
    """The options of ``ioattn io``; each help names its default."""
    add = parser.add_argument
    add("--seqlen", type=int_list(), required=True, metavar="N[,N...]",
        help="query sequence length, or several (a sweep) (required: no default)")
    add("--headdim", type=int_list(), required=True, metavar="D[,D...]",
        help="head dimension, or several (a sweep) (required: no default)")
    add("--batch", type=int, default=1, metavar="B", help="batch size (default: 1)")
    add("--nheads", type=int, default=1, metavar="H", help="query heads (default: 1)")
    add("--nheads-kv", type=int, default=None, metavar="H",
        help="key/value heads, fewer than --nheads for GQA (default: --nheads)")
    add("--seqlen-k", type=int, default=None, metavar="N", help="key sequence length (default: --seqlen)")
    add("--dtype", choices=list(ELEMENT_BYTES), default="bf16",
        help="element type of q, k, v (default: bf16); fp8's output is bf16 and it has no backward")
    add("--block-m", type=int_list(), default=[None], metavar="ROWS[,ROWS...]",
        help="query rows per tile of every tiled pass, or several (a sweep) (default: derived from --sram as the "
             "paper's Algorithm 1)")
    add("--block-n", type=int_list(), default=[None], metavar="ROWS[,ROWS...]",
        help="key rows per tile of every tiled pass, or several (a sweep) (default: derived from --sram as the "
             "paper's Algorithm 1)")
    add("--sram", type=int, default=None, metavar="BYTES",
        help=f"on-chip memory M in bytes (default: the device's shared memory per SM, {DEVICES['h100'].sram // KB} KB)")
    add("--device", choices=list(DEVICES), default=DEFAULT_DEVICE,
        help=f"bandwidth and peak FLOP/s of the time bound (default: {DEFAULT_DEVICE})")
    add("--causal", action="store_true", help="causal mask, bottom-right aligned (default: not causal)")
    add("--json", action="store_true", help="print one JSON object with every term (default: the table)")
    add("--out", default=None, metavar="DIR",
        help="write results.jsonl (one object a point) and io_model.png, bytes against N (default: print only)")
    add("--measure", action="store_true",
        help="also measure the DRAM bytes of one call by Nsight Compute (a GPU and ncu): the standard row's by "
             "PyTorch's math attention, the fa2 row's by ioattn's kernels, at --block-m x --block-n when both are "
             "given (its portable kernels; powers of two, 16 to 256) (default: the model alone)")
    return parser


def _point(args, seqlen, headdim, block_m, block_n):
    """(problem, prediction as a dict, the kernels' tiles for ``--measure`` or None) at one point; a bad
    size is the parser's error, naming its option."""
    try:
        problem = Problem(seqlen, headdim, seqlen_k=args.seqlen_k, batch=args.batch, nheads=args.nheads,
                          nheads_kv=args.nheads_kv, dtype=args.dtype, causal=args.causal)
        data = predict(problem, args.device, args.sram, block_m, block_n).as_dict()
        return problem, data, _kernel_tiles(args, block_m, block_n)
    except ModelArgumentError as e:
        flag = FLAGS.get(e.argument, "--" + e.argument.replace("_", "-"))
        args.parser.error(f"{flag} {e.problem}")


def _kernel_tiles(args, block_m, block_n):
    """The kernels' (block_m, block_n) for ``--measure`` when both tiles are given, else None; tiles the
    kernels cannot take are the parser's error."""
    if not (args.measure and block_m and block_n):
        return None
    for flag, value in (("--block-m", block_m), ("--block-n", block_n)):
        if value not in (16, 32, 64, 128, 256):
            args.parser.error(f"{flag} with --measure: the kernels take powers of two from 16 to 256, got {value}")
    return block_m, block_n


def run(args):
    """Print the prediction at each (head dim, tiles, seqlen) point, measured too with ``--measure``; with
    ``--out``, the records and the plot."""
    points = [_point(args, n, d, bm, bn) for d in args.headdim for bm in args.block_m for bn in args.block_n
              for n in args.seqlen]  # every size checked first
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    records = []
    for problem, data, tiles in points:
        if args.measure:
            from ioattn.bench.io_measure import MeasureError
            try:
                _add_measured(data, problem, tiles)
            except MeasureError as e:
                print(f"ioattn io --measure: {e}", file=sys.stderr)
                return 1
        data["command"] = "ioattn " + " ".join(getattr(args, "argv", None) or ["io"])
        records.append(data)
        if not args.json:
            print(table(data) + "\n")
    if args.json:  # one object, or a list of them for a sweep
        print(json.dumps(records[0] if len(records) == 1 else records, indent=2))
    if args.out:
        _write(records, args.out)
    return 0


def _write(records, out):
    with open(os.path.join(out, "results.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    try:
        print(f"wrote {plot(records, os.path.join(out, 'io_model.png'))}")
    except ImportError:  # matplotlib is the optional [bench] extra
        print("no plot: matplotlib is not installed (pip install 'ioattn[bench]')")


def _plot_row(ax, xs, color, style, name):
    """One row's model line (bytes per head; the same per head at every batch and head count) and its
    measured points: circles, squares where the call had more than one (batch, head)."""
    line = {n: r["predicted"]["bytes"] / heads for n, heads, r in xs}
    ax.plot(list(line), list(line.values()), "." + style, color=color, label=f"{name} (model)")
    for many in (False, True):
        got = [(n, r["measured"]["bytes"] / heads, r["measured"]["impl"]) for n, heads, r in xs
               if "measured" in r and (heads > 1) == many]
        if got:
            ax.plot([g[0] for g in got], [g[1] for g in got], "s" if many else "o", color=color,
                    label=f"{got[0][2]} (measured{', many heads' if many else ''})")


def plot(records, path):
    """Bytes per (batch, head) against the sequence length, one panel a (pass, head dim): the model's
    standard, fa2 and minimum rows as lines, the measured bytes (where there are) as points, a square
    where the call had more than one (batch, head) (sharing the L2 with the others)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = sorted({(r["pass"], rec["problem"]["headdim"]) for rec in records for r in rec["rows"]},
                    key=lambda p: (p[0] != "forward", p[1]))
    fig = Figure(figsize=(5 * len(panels), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    for i, (direction, d) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        pts = sorted(((rec["problem"]["seqlen_q"], rec["problem"]["batch"] * rec["problem"]["nheads"], r)
                      for rec in records if rec["problem"]["headdim"] == d
                      for r in rec["rows"] if r["pass"] == direction), key=lambda t: t[:2])
        if len({(n, heads) for n, heads, _ in pts}) == 1 and len({_tiles(r) for _, _, r in pts
                                                                  if r["algorithm"] == "fa2"}) > 1:
            _plot_tiles(ax, pts)  # one call, several tile sizes: bytes against the tile size
            ax.set_title(f"{direction}, d = {d}, N = {pts[0][0]}, {pts[0][1]} (batch, head)")
            ax.legend(fontsize="small")
            continue
        for j, algorithm in enumerate(("standard", "fa2", "minimum")):
            xs = [(n, heads, r) for n, heads, r in pts if r["algorithm"] == algorithm]
            groups = sorted({_tiles(r) for _, _, r in xs}) if algorithm == "fa2" else [None]
            for g, tiles in enumerate(groups):  # fa2: a line a tile size (the others do not depend on them)
                rows = [x for x in xs if tiles is None or _tiles(x[2]) == tiles]
                _plot_row(ax, rows, f"C{j}", ("-", "--", ":")[g % 3], algorithm + (f" {tiles}" if len(groups) > 1 else ""))
        ax.set(xscale="log", yscale="log", xlabel="sequence length N", ylabel="HBM bytes per (batch, head)",
               title=f"{direction}, d = {d}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=90)
    return path


def _plot_tiles(ax, pts):
    """One call's bytes per (batch, head) against the tile size (block_m x block_n): the model's fa2 and
    ioattn's measured bytes a point a tile size; standard attention (model and measured) and the
    minimum, which do not depend on the tiles, as horizontal lines."""
    heads = pts[0][1]
    fa2 = sorted((r for _, _, r in pts if r["algorithm"] == "fa2"), key=lambda r: _tile_pair(r))
    names = [_tiles(r) for r in fa2]
    ax.plot(names, [r["predicted"]["bytes"] / heads for r in fa2], "o-", color="C1", label="fa2 (model)")
    got = [(name, r["measured"]["bytes"] / heads) for name, r in zip(names, fa2) if "measured" in r]
    if got:
        ax.plot([g[0] for g in got], [g[1] for g in got], "s-", color="C1", mfc="none",
                label=f"{fa2[0]['measured']['impl']} (measured)")
    for j, algorithm in ((0, "standard"), (2, "minimum")):
        row = next((r for _, _, r in pts if r["algorithm"] == algorithm), None)
        if row is None:
            continue
        ax.axhline(row["predicted"]["bytes"] / heads, color=f"C{j}", ls="--", label=f"{algorithm} (model)")
        if "measured" in row:
            ax.axhline(row["measured"]["bytes"] / heads, color=f"C{j}", ls=":",
                       label=f"{row['measured']['impl']} (measured)")
    ax.set(yscale="log", xlabel="tile: block_m x block_n", ylabel="HBM bytes per (batch, head)")
    ax.grid(True, alpha=0.3)


def _tile_pair(row):
    t = row.get("tiles") or {}
    return (t.get("block_m", 0), t.get("block_n", 0))


# the row each implementation's measurement sits beside
MEASURED = {"standard": "math", "fa2": "ioattn"}


def _add_measured(data, problem, tiles=None):
    """Each measured row gets ``measured`` (read, written, bytes, kernels, impl, the kernels' tiles where
    fixed) and its bytes over the predicted ones; FP8 has no backward to measure. ``tiles``: (block_m,
    block_n) for ioattn's portable kernels (``--block-m`` and ``--block-n`` both given)."""
    from ioattn.bench import io_measure

    for row in data["rows"]:
        impl = MEASURED.get(row["algorithm"])
        if impl is None or problem.dtype == "fp8":
            continue
        got = io_measure.measure(problem, impl, row["pass"], tiles=tiles)
        fixed = {"kernel_tiles": list(tiles)} if tiles and impl == "ioattn" else {}
        row["measured"] = dict(got, impl=impl, vs_predicted=got["bytes"] / row["predicted"]["bytes"], **fixed)
    data["notes"].append("measured: DRAM bytes of one call by Nsight Compute (dram__bytes_read.sum + "
                         "dram__bytes_write.sum over its kernels): standard <- PyTorch's math attention, fa2 <- "
                         "ioattn's dispatched kernels.")


def _num(value):
    """Three significant digits, without an exponent: 0.0154, 2.48, 221, 4080."""
    return f"{value:.0f}" if value >= 100 else f"{value:#.3g}"


def _si(value, unit):
    """``value`` with a decimal prefix: 8.72 GB, 550 GFLOP."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, "")):
        if value >= factor:
            return f"{_num(value / factor)} {prefix}{unit}"
    return f"{_num(value)} {unit}"


def _duration(seconds):
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if seconds >= factor:
            return f"{_num(seconds / factor)} {unit}"
    return f"{_num(seconds / 1e-9)} ns"


def _tiles(row):
    t = row["tiles"]
    return "-" if t is None else f"{t['block_m']}x{t['block_n']}"


COLUMNS = (
    ("pass", lambda r: r["pass"]),
    ("algorithm", lambda r: r["algorithm"]),
    ("tiles", _tiles),
    ("bytes", lambda r: _si(r["predicted"]["bytes"], "B")),
    ("vs standard", lambda r: f"{_num(r['predicted']['vs_standard'])}x"),
    ("FLOPs", lambda r: _si(r["predicted"]["flops"], "FLOP")),
    ("FLOP/B", lambda r: _num(r["predicted"]["intensity"])),
    ("bound", lambda r: r["predicted"]["bound"]),
    ("time >=", lambda r: _duration(r["predicted"]["time_s"])),
    ("measured", lambda r: (f"{_si(r['measured']['bytes'], 'B')} ({_num(r['measured']['vs_predicted'])}x)"
                            if "measured" in r else "")),
)


def _heading(data):
    p, dev = data["problem"], data["device"]
    causal = "causal" if p["causal"] else "not causal"
    balance = dev["peak_flops"] / dev["bandwidth"]
    return (f"IO model of attention: batch {p['batch']}, query heads {p['nheads']}, KV heads {p['nheads_kv']}, seqlen "
            f"{p['seqlen_q']} (keys {p['seqlen_k']}), head dim {p['headdim']}, {p['dtype']}, {causal}\n"
            f"device {dev['name']}: {_si(dev['bandwidth'], 'B/s')}, {_si(dev['peak_flops'], 'FLOP/s')} "
            f"{p['dtype']} (balance {_num(balance)} FLOP/B); on-chip memory M = {dev['sram']} bytes")


def _footer(data):
    kv, l2 = data["kv_bytes_per_head"], data["device"]["l2"]
    where = "fits in" if kv <= l2 else "exceeds"
    return [f"bytes: HBM bytes read + written, every access counted (no cache). K and V of one KV head: "
            f"{_si(kv, 'B')}, which {where} the {l2 / MIB:g} MiB L2: measured DRAM bytes of the tiled passes fall "
            "toward the minimum row where K and V stay in L2.",
            f"time >=: max(bytes / bandwidth, FLOPs / peak); {data['device']['source']}. --json: every term.",
            *data["notes"]]


def table(data):
    """The heading, one line per pass with ``COLUMNS``, and what the figures assume."""
    columns = COLUMNS if any("measured" in r for r in data["rows"]) else COLUMNS[:-1]
    cells = [[name for name, _ in columns]] + [[cell(r) for _, cell in columns] for r in data["rows"]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join([_heading(data), "", *lines, "", *_footer(data)])
