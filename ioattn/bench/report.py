"""``ioattn bench report RESULTS.jsonl [--out DIR]``: tables and plots from a results file.

Everything here reads the records that ``ioattn bench`` wrote; nothing is measured again, so a
table or plot can always be traced back to one committed results file.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import zlib

REQUIRED_FIELDS = {
    "sweep": str, "provider": str, "mode": str, "dtype": str, "batch": int, "nheads": int,
    "nheads_kv": int, "headdim": int, "seqlen_q": int, "seqlen_k": int, "causal": bool,
    "ms": (float, int, type(None)), "ok": bool, "device": str,
}
VALUE_FIELDS = ("tflops", "gbps", "peak_mem_mb")  # at least one present; which one depends on mode
OPTIONAL_FIELDS = {"paged": bool, "error": str, "max_err": (float, int, type(None)), "env": dict,
                   "ceilings": dict, "command": str, "us": (float, int, type(None)),
                   "host_ms": (float, int, type(None)), "layout": str, "err_bound": (float, int, type(None)),
                   "check": dict, "headdim_v": int, "latent": bool,
                   **{v: (float, int, type(None)) for v in VALUE_FIELDS}}
REPORT_HELP = "tables and plots from a results.jsonl that ioattn bench wrote (nothing is measured)"
MODES = ("fwd", "bwd", "fwdbwd", "decode", "memory")
DTYPES = ("fp32", "bf16", "fp16", "fp8")
# (record field, unit, ceiling key): decode is bandwidth-bound, the memory sweep measures bytes.
GBPS = ("gbps", "GB/s", "d2d_copy_gbps")
MEMORY = ("peak_mem_mb", "peak MB", None)
THROUGHPUT = ("tflops", "TFLOP/s", "bf16_matmul_tflops")
CEILING_NAMES = {"bf16_matmul_tflops": "bf16 matmul", "d2d_copy_gbps": "d2d copy"}
MODE_NAMES = {"fwd": "forward", "bwd": "backward", "fwdbwd": "forward + backward", "decode": "decode",
              "memory": "peak memory"}
COLOURS = {"ioattn": "#d62728", "ioattn-ptr": "#ff7f0e", "ioattn-tma": "#ff7f0e", "ioattn-hopper": "#7f7f00", "sdpa": "#2f4f4f", "sdpa-flash": "#1f77b4", "sdpa-cudnn": "#2ca02c",
           "sdpa-efficient": "#9467bd", "sdpa-math": "#8c564b", "flex": "#e377c2", "flash-attn": "#17becf",
           "flash-attn-cute": "#bcbd22", "ioattn-graph": "#8b0000", "ioattn-paged": "#ff9896",
           "ioattn-checked": "#c49c94", "ioattn-unified": "#f7b6d2",
           "ioattn-pdl": "#e6550d", "ioattn-graph-pdl": "#636363",
           "ioattn-nopdl": "#e6550d", "ioattn-graph-nopdl": "#636363"}
SPARE = ("#7f7f7f", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173")


def _metric(r):
    # the memory sweep may label its records with the pass it measured (e.g. "fwdbwd"), not "memory"
    if r["mode"] == "memory" or r["sweep"] == "memory" or "peak_mem_mb" in r:
        return MEMORY
    return GBPS if r["mode"] == "decode" else THROUGHPUT


def _ceiling_applies(ceiling, dtype):
    # the bf16 matmul peak is also fp16's on Hopper but says nothing about fp8; a copy is dtype-blind
    return ceiling == "d2d_copy_gbps" or (ceiling == "bf16_matmul_tflops" and dtype in ("bf16", "fp16"))


def _numbered(path):
    """(line number, record) pairs; blank lines skipped, anything else that is not an object fails."""
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: malformed JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{i}: not a JSON object")
            out.append((i, rec))
    return out


def load(path):
    return [rec for _, rec in _numbered(path)]


def validate(record):
    """Schema problems of one record (empty list: fine)."""
    if not isinstance(record, dict):
        return ["not a JSON object"]
    problems = []
    for name, types in {**REQUIRED_FIELDS, **OPTIONAL_FIELDS}.items():
        if name not in record:
            if name in REQUIRED_FIELDS:
                problems.append(f"missing field {name!r}")
            continue
        value, types = record[name], types if isinstance(types, tuple) else (types,)
        # bool is an int subclass: a True batch size is still a wrong type (and so is a 0/1 causal)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            expected = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            problems.append(f"{name!r} is {type(value).__name__}, expected {expected}")
    if not any(v in record for v in VALUE_FIELDS):
        problems.append(f"none of {', '.join(VALUE_FIELDS)} present")
    if isinstance(record.get("mode"), str) and record["mode"] not in MODES:
        problems.append(f"unknown mode {record['mode']!r} (known: {', '.join(MODES)})")
    if isinstance(record.get("dtype"), str) and record["dtype"] not in DTYPES:
        problems.append(f"unknown dtype {record['dtype']!r} (known: {', '.join(DTYPES)})")
    return problems


def _value(r):
    v = r.get(_metric(r)[0])
    return v if r.get("ok") and isinstance(v, (int, float)) and not math.isnan(v) else None


def _batch_key(r):
    # decode cases differ by batch at one KV length; elsewhere the batch follows from the sequence length
    return r["batch"] if r["mode"] == "decode" else 0


def _cells(records):
    """{(sweep, dtype, headdim, causal, seqlen_q, seqlen_k, mode, batch): {provider: record}}, batch 0
    outside decode.

    A provider that could not run is recorded once, under "fwd"; if it also has a good record for the
    same cell (a later mode failed), the good one wins, so a figure is never hidden by a failure."""
    cells = {}
    for r in records:
        key = (r["sweep"], r["dtype"], r["headdim"], r["causal"], r["seqlen_q"], r["seqlen_k"], r["mode"],
               _batch_key(r))
        old = cells.setdefault(key, {}).get(r["provider"])
        if old is None or _rank(r) >= _rank(old):
            cells[key][r["provider"]] = r
    return cells


def _rank(r):
    return 2 if _value(r) is not None else 1 if _ran(r) else 0


def _ran(r):
    # it produced a number (time or memory) but failed its check, vs it never produced anything
    return r.get("ms") is not None or r.get(_metric(r)[0]) is not None


def _us(r):
    # a step time only beside a valid figure (a failed check shows no number)
    ok = r is not None and _value(r) is not None and isinstance(r.get("ms"), (int, float))
    return f"{1e3 * r['ms']:.1f}" if ok else "-"


def _host_us(r):
    ok = r is not None and isinstance(r.get("host_ms"), (int, float))
    return f"{1e3 * r['host_ms']:.0f}" if ok else "-"


def _status(r):
    if r is None:
        return "n/a"
    v = _value(r)
    if v is not None:
        return f"{v:.0f}" if _metric(r) is MEMORY else (f"{v:.1f}" if v >= 10 else f"{v:.3g}")  # CPU figures are small
    return "fail" if _ran(r) else "n/a"


def _best_peer(row, ours):
    """(name, value) of the best provider not named ioattn*: fastest, or smallest for memory."""
    peers = {p: _value(r) for p, r in row.items() if not p.startswith(ours) and _value(r) is not None}
    if not peers:
        return None, None
    pick = min if any(_metric(r) is MEMORY for r in row.values()) else max
    return pick(peers.items(), key=lambda kv: kv[1])


def _order(key):
    # (headdim, causal, seqlen_q, seqlen_k, mode, batch), with modes in pipeline order, not alphabetical;
    # decode rows by (headdim, batch, KV length)
    if key[4] == "decode":
        return (key[0], key[5], key[3])
    return (*key[:4], MODES.index(key[4]) if key[4] in MODES else len(MODES), key[4])


def _seqlen_label(sq, sk):
    return str(sq) if sq == sk else f"{sq}/{sk}"


def _ratio(mine, peer):
    """The peer's cost over ours at one cell (> 1: ours is faster, or smaller for memory): its time
    over ours, or its peak memory over ours; None unless both have a valid figure."""
    if mine is None or peer is None or _value(mine) is None or _value(peer) is None:
        return None
    if _metric(mine) is MEMORY:
        return _value(peer) / _value(mine) if _value(mine) else None
    a, b = mine.get("ms"), peer.get("ms")
    ok = isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0
    return b / a if ok else None


def _ratio_text(x):
    return "-" if x is None else f"{x:.2f}"


def table(records, mode=None, ours="ioattn"):
    """One section per (sweep, dtype, unit); one row per (headdim, causal, seqlen, mode) in it, or per
    (headdim, batch, KV length) for decode, with ours' step time in microseconds; a column ``vs P``
    per peer P: P's time over ours at that row (``_ratio``; > 1: ours faster)."""
    cells = {k: v for k, v in _cells(records).items() if mode is None or k[6] == mode}
    sections = {}
    for key, row in cells.items():
        sections.setdefault((key[0], key[1], _metric(next(iter(row.values())))), {})[key[2:]] = row
    out = []
    for (sweep, dtype, (_, unit, ceiling)), rows in sorted(sections.items(), key=lambda kv: kv[0][:2]):
        provs = sorted({p for row in rows.values() for p in row}, key=lambda p: (not p.startswith(ours), p))
        devices = sorted({r["device"] for row in rows.values() for r in row.values()})
        decode = unit == GBPS[1]
        cols = (["d", "batch", "kvlen", "mode"] if decode else ["d", "causal", "seqlen", "mode"]) + provs
        # decode: the step time in microseconds of ours (and of its CUDA-graph replay), for the latency targets
        us_cols = [p for p in (ours, f"{ours}-graph") if p in provs] if decode else []
        # latency: ours' per-call latency and every provider's host time per call, in microseconds
        latency = sweep == "latency"
        if latency:
            us_cols = [p for p in (ours,) if p in provs]
        host_cols = provs if latency else []
        vs = [p for p in provs if ours in provs and not p.startswith(ours)
              and any(_ratio(row.get(ours), row.get(p)) is not None for row in rows.values())]
        cols += ([f"{p} us" for p in us_cols] + [f"{p} host us" for p in host_cols] + [f"vs {p}" for p in vs]
                 + [f"{ours} / best peer"])
        show_pct = _ceiling_applies(ceiling, dtype) and any(
            ceiling in (r.get("ceilings") or {}) for row in rows.values() for r in row.values())
        if show_pct:
            cols.append(f"{ours} % of {CEILING_NAMES[ceiling]}")
        lines = []
        for (d, causal, sq, sk, m, b), row in sorted(rows.items(), key=lambda kv: _order(kv[0])):
            line = [str(d), str(b), str(sk)] if decode else [str(d), "yes" if causal else "no", _seqlen_label(sq, sk)]
            line += [m] + [_status(row.get(p)) for p in provs]
            line += [_us(row.get(p)) for p in us_cols]
            line += [_host_us(row.get(p)) for p in host_cols]
            line += [_ratio_text(_ratio(row.get(ours), row.get(p))) for p in vs]
            mine = _value(row[ours]) if ours in row else None
            name, best = _best_peer(row, ours)
            line.append(f"{mine / best:.2f} {name}" if mine is not None and best else "-")
            if show_pct:
                c = (row.get(ours, {}).get("ceilings") or {}).get(ceiling)
                line.append(f"{100 * mine / c:.0f}%" if mine is not None and c else "-")
            lines.append(line)
        widths = [max(len(c), *(len(ln[i]) for ln in lines)) for i, c in enumerate(cols)]
        out.append(f"== {sweep} sweep, {dtype}, {unit}, {', '.join(devices)} ==")
        out += ["  ".join(s.rjust(w) for s, w in zip(ln, widths)) for ln in [cols] + lines]
        # why something is "fail" / "n/a": one line per (provider, reason), never left out
        why = collections.Counter((p, _status(r), r.get("error", "no value recorded"))
                                  for row in rows.values() for p, r in row.items() if _value(r) is None)
        out += [f"  {p}: {s} x{n}: {e}" for (p, s, e), n in sorted(why.items())]
        out.append("")
    return "\n".join(out).rstrip("\n")


def ratio_summary(records, ours="ioattn"):
    """Lines that say, per (sweep, dtype) and peer, at how many points ours is as fast as the peer or
    faster (as small or smaller for memory: ``_ratio`` >= 1), and the median and range of the ratio;
    then what the ratio means."""
    groups = {}
    for key, row in _cells(records).items():
        for p in row:
            x = None if p.startswith(ours) else _ratio(row.get(ours), row[p])
            if x is not None:
                groups.setdefault((key[0], key[1], p, _metric(row[p]) is MEMORY), []).append(x)
    lines = []
    for (sweep, dtype, peer, memory), xs in sorted(groups.items()):
        xs.sort()
        above = sum(x >= 1 for x in xs)
        median = xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
        as_good = "uses as little memory or less" if memory else "is as fast or faster"
        lines.append(f"{ours} vs {peer} ({sweep}, {dtype}): {ours} {as_good} at {above} of {len(xs)} points; "
                     f"ratio median {median:.2f}, range {xs[0]:.2f} to {xs[-1]:.2f}")
    if lines:
        what = {False: "time", True: "peak memory"}
        kinds = sorted({memory for *_, memory in groups})
        lines += [f"(ratio = the peer's {what[m]} / {ours}'s at the same point: > 1 means {ours} "
                  f"{'uses less' if m else 'is faster'})" for m in kinds]
    return lines


def check_summary(records):
    """One line: how many correctness checks passed (one per provider and configuration: sweep,
    dtype, head dim, causal, layout), per provider, and which failed; "" without checked records."""
    from ioattn.bench.verdict import BOUND_TEXT

    checks = {}
    for r in records:
        if "err_bound" in r:
            checks[(r["sweep"], r["dtype"], r["provider"], r["headdim"], r["causal"], r.get("layout"))] = r["ok"]
    if not checks:
        return ""
    per = collections.defaultdict(lambda: [0, 0])
    for (_, _, p, *_), ok in checks.items():
        per[p][0] += ok
        per[p][1] += 1
    passed = sum(checks.values())
    tally = ", ".join(f"{p} {a}/{n}" for p, (a, n) in sorted(per.items(), key=lambda kv: (not kv[0].startswith("ioattn"), kv[0])))
    failed = [f"{p} d={d} causal={int(c)}" for (_, _, p, d, c, _), ok in sorted(checks.items()) if not ok]
    head = "correctness: all" if not failed else "correctness: FAIL:"
    tail = f"; failed: {', '.join(failed)}" if failed else ""
    return (f"{head} {passed} of {len(checks)} checks pass ({tally}){tail}; "
            f"bound: {BOUND_TEXT}, against the float64 oracle")


def ratio_rows(records, ours="ioattn"):
    """(headdim, causal, seqlen, mode, ours, best peer name, best peer value, ours / best peer) per
    cell where ``ours`` has a figure; peer fields are None where no peer has one. ``seqlen`` is the
    key length (the query length too, outside decode; decode rows come in batch order, then by key
    length). Records must come from one sweep and dtype."""
    groups = {(r["sweep"], r["dtype"]) for r in records}
    if len(groups) > 1:
        raise ValueError(f"ratio_rows: records span several (sweep, dtype) groups {sorted(groups)}; filter first")
    rows = []
    for (_, _, d, causal, _, sk, m, _), row in sorted(_cells(records).items(), key=lambda kv: _order(kv[0][2:])):
        mine = _value(row[ours]) if ours in row else None
        if mine is None:
            continue
        name, best = _best_peer(row, ours)
        rows.append((d, causal, sk, m, mine, name, best, mine / best if best else None))
    return rows


def _colour(provider):
    # crc32, not hash(): the colour must not change from one run (or PYTHONHASHSEED) to the next
    return COLOURS.get(provider, SPARE[zlib.crc32(provider.encode()) % len(SPARE)])


def _k(n):
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def plot(records, out_dir, ours="ioattn"):
    """PNG line plots, one figure per (sweep, dtype, mode), one panel per (headdim, causal), or per
    (headdim, batch) for decode (x: the KV length)."""
    # Figure + Agg canvas directly, not pyplot: no display, no global backend switch for the caller
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    figs = {}
    for r in records:
        if _value(r) is not None:
            # decode: one panel per batch (its column), instead of causal / not causal
            figs.setdefault((r["sweep"], r["dtype"], r["mode"]), {}).setdefault(
                (r["headdim"], r["batch"] if r["mode"] == "decode" else r["causal"]), []).append(r)
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for (sweep, dtype, mode), panels in sorted(figs.items()):
        field, unit, ceiling_key = _metric(next(iter(panels.values()))[0])
        # the papers' grid: one row per head dim, non-causal left and causal right
        dims, flags = sorted({d for d, _ in panels}), sorted({c for _, c in panels})
        if mode == "decode":  # one panel per (head dim, batch), two to a row
            ncols = min(2, len(panels))
            nrows = -(-len(panels) // ncols)
            slot = {key: i + 1 for i, key in enumerate(sorted(panels))}
        else:
            ncols, nrows = len(flags), len(dims)
            slot = {(d, c): dims.index(d) * len(flags) + flags.index(c) + 1 for d, c in panels}
        fig = Figure(figsize=(max(7.5, 5.5 * ncols), 3.6 * nrows + 0.9), layout="constrained")
        FigureCanvasAgg(fig)
        handles = {}
        for (d, causal) in sorted(panels):
            ax = fig.add_subplot(nrows, ncols, slot[(d, causal)])
            recs = panels[(d, causal)]
            provs = sorted({r["provider"] for r in recs}, key=lambda p: (not p.startswith(ours), p))
            for p in provs:
                pts = sorted({r["seqlen_k"]: _value(r) for r in recs if r["provider"] == p}.items())
                mine = p.startswith(ours)
                (h,) = ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color=_colour(p),
                               linewidth=2.8 if mine else 1.5, markersize=6 if mine else 4, label=p,
                               zorder=3 if mine else 2)
                handles.setdefault(p, h)
            ceils = [(r.get("ceilings") or {}).get(ceiling_key) for r in recs] if ceiling_key else []
            ceils = [c for c in ceils if c]
            if ceils and _ceiling_applies(ceiling_key, dtype):
                h = ax.axhline(max(ceils), color="black", linestyle="--", linewidth=1)
                handles.setdefault(f"{CEILING_NAMES[ceiling_key]} ceiling ({max(ceils):.0f} {unit})", h)
            xs = sorted({r["seqlen_k"] for r in recs})
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [_k(x) for x in xs])
            ax.xaxis.set_minor_locator(NullLocator())
            if field == "peak_mem_mb":
                ax.set_yscale("log")
            else:
                ax.set_ylim(bottom=0)
            if mode == "decode":  # the panel key's second field is the batch here
                ax.set_title(f"head dim {d}, batch {causal}")
            else:
                ax.set_title(f"head dim {d}, {'causal' if causal else 'not causal'}")
            ax.set_xlabel("KV length" if mode == "decode" else "sequence length")
            ax.set_ylabel(unit)
            ax.grid(True, alpha=0.3)
        devices = ", ".join(sorted({r["device"] for ps in panels.values() for r in ps}))
        what = MODE_NAMES.get(mode, mode)
        if field == "peak_mem_mb" and mode != "memory":
            what = f"peak memory of the {what}"
        fig.suptitle(f"{sweep} sweep: attention {what}, {dtype}, {unit} ({devices})")
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=min(6, len(handles)))
        # memory_bf16.png, decode_bf16.png: the mode only goes in the name when it tells files apart
        alone = sum(k[:2] == (sweep, dtype) for k in figs) == 1
        name = f"{sweep}_{dtype}" + ("" if mode == sweep or (alone and field != "tflops") else f"_{mode}") + ".png"
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=110)
        written.append(path)
    return written


def add_arguments(parser):
    """The arguments of ``ioattn bench report`` (the command line's one definition of them)."""
    parser.add_argument("results", help="a results.jsonl written by ioattn bench")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="folder for the PNGs (default: the results file's folder)")
    return parser


def run(args):
    """``ioattn bench report`` on parsed arguments; the exit status."""
    try:
        numbered = _numbered(args.results)
    except OSError as e:
        print(f"ioattn bench report: cannot read {args.results}: {e.strerror}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"ioattn bench report: {e}", file=sys.stderr)
        return 2
    good = []
    for line, rec in numbered:
        problems = validate(rec)
        if problems:  # one bad record should not hide the rest of a long device run
            print(f"skipped {args.results}:{line}: {'; '.join(problems)}", file=sys.stderr)
        else:
            good.append(rec)
    print(table(good))
    for line in [*ratio_summary(good), check_summary(good)]:
        if line:
            print(line)
    try:
        paths = plot(good, args.out or os.path.dirname(os.path.abspath(args.results)))
    except ImportError:  # matplotlib is the optional [bench] extra; the table alone is still useful
        print("no plots: matplotlib is not installed (pip install 'ioattn[bench]')", file=sys.stderr)
        return 0
    for path in paths:
        print(f"wrote {path}")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="ioattn bench report", description=REPORT_HELP)
    return run(add_arguments(ap).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
