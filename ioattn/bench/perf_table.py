"""The performance table of docs/performance.md, rendered from committed results files (never typed
by hand). ``python benchmarks/readme_table.py`` runs it; the tests check the committed table against it.

    python benchmarks/readme_table.py RESULTS.jsonl [MORE.jsonl ...] [--write docs/performance.md]

With several files, each head dim's rows come from the last file that has that head dim, so every
row's ratios compare providers measured in one run (the caption names the file of each head dim).
``FILE:64,128`` takes only those head dims from FILE (a sweep whose other head dims ran a build that
is no longer the default).
"""
import argparse
import json
import re

START, END = "<!-- perf:start -->", "<!-- perf:end -->"


def table(paths, ours="ioattn", peer="sdpa-flash", extra="ioattn-hopper"):
    """One row per (head dim, mask, seqlen): ours in TFLOP/s, its ratio to ``peer`` and to the best
    peer of that row (the fastest provider whose name does not start with "ioattn"); when the files
    have ``extra`` (another of the project's providers), its forward and ratio to the best peer too. A
run without ``peer`` shows "-" in its ratio columns."""
    paths = [paths] if isinstance(paths, str) else list(paths)
    by, source, device = {}, {}, "?"
    for spec in paths:
        path, _, only = spec.partition(":")
        recs = [json.loads(line) for line in open(path)]
        if only:
            keep = {int(x) for x in only.split(",")}
            recs = [r for r in recs if r.get("headdim") in keep]
        dims = {r["headdim"] for r in recs if r.get("tflops") is not None}
        for key in [k for k in by if k[0] in dims]:  # a later file replaces a head dim entirely
            del by[key]
        for r in recs:
            if r.get("tflops") is not None:
                by.setdefault((r["headdim"], r["causal"], r["seqlen_q"], r["mode"]), {})[r["provider"]] = r["tflops"]
                device = r["device"]
        source.update({d: spec for d in dims})  # the caption names the spec, so the table re-renders from it
    files = sorted(set(source.values()), key=paths.index)
    show_extra = any(extra in row for key, row in by.items() if key[3] == "fwd")
    where = "; ".join(f"head dim {', '.join(str(d) for d in sorted(d for d in source if source[d] == f))}: `{f}`"
                      for f in files)
    lines = [f"bf16, batch x seqlen = 16384 tokens, hidden 2048, {device}, TFLOP/s (forward 4·B·H·N²·D, halved "
             f"when causal; backward 2.5x). Sources: {where}; each row's providers measured in one run. "
             f"x {peer}: {ours} over {peer}; best peer: the fastest other provider of the row."
             + (f" fwd {extra}: that provider's forward in the same run, over the best peer." if show_extra else ""),
             "",
             f"| head dim | causal | seqlen | fwd {ours} | x {peer} | fwd best peer | x best | bwd {ours} | "
             f"x {peer} | bwd best peer | x best |" + (f" fwd {extra} | x best |" if show_extra else ""),
             "|" + "---|" * (13 if show_extra else 11)]

    def cells(row):
        others = {p: t for p, t in row.items() if not p.startswith("ioattn")}
        name = max(others, key=others.get)
        vs_peer = f"{row[ours] / row[peer]:.2f}" if peer in row else "-"  # a run without that peer
        return (f"{row[ours]:.0f} | {vs_peer} | {others[name]:.0f} ({name}) | "
                f"{row[ours] / others[name]:.2f}")

    for d, c, n in sorted({k[:3] for k in by}):
        f, b = by.get((d, c, n, "fwd"), {}), by.get((d, c, n, "bwd"), {})
        if ours not in f or ours not in b or len(f) < 2 or len(b) < 2:
            continue
        line = f"| {d} | {'yes' if c else 'no'} | {n} | {cells(f)} | {cells(b)} |"
        if show_extra:
            best = max(t for p, t in f.items() if not p.startswith("ioattn"))
            line += f" {f[extra]:.0f} | {f[extra] / best:.2f} |" if extra in f else " - | - |"
        lines.append(line)
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description="the performance table of docs/performance.md from results files")
    ap.add_argument("results", nargs="+")
    ap.add_argument("--write", default=None, help="the file to update between the perf markers (docs/performance.md)")
    args = ap.parse_args(argv)
    t = table(args.results)
    if not args.write:
        print(t)
        return
    text = open(args.write).read()
    new = re.sub(re.escape(START) + ".*?" + re.escape(END), START + "\n" + t + "\n" + END, text, flags=re.S)
    open(args.write, "w").write(new)
