"""A/B of whole versions of the package: one `ioattn bench` sweep run over copies of `ioattn/` taken
from git revisions (or the working tree), each copy imported by its own runs and no other.

    python benchmarks/ab_packages.py prepare NAME=REV[+PATCH] [...]    # here, before the device call
    python benchmarks/ab_packages.py run --out DIR [--repeat R] NAME [NAME ...] -- SWEEP [bench options]

``prepare`` writes ``out/packages/NAME/ioattn`` (``git archive REV``; ``REV`` = ``.`` copies the working
tree's; ``+PATCH``: then the patch file's changes to ``ioattn/`` applied, an experiment kept as a patch
under ``benchmarks/patches/`` until its A/B decides it) under the ignored ``out/``: carry ``out/packages`` to
the device. ``run`` runs ``python -m ioattn
bench SWEEP ... --out DIR/NAME-r`` from inside each copy (``python -m`` puts the working directory
first on ``sys.path``: run from the repository root, every copy would import the root's package),
the names in turn, ``--repeat`` rounds of them, each round starting one name later (the run that follows
another was measured a few per cent faster on the same code: the rotation spreads it over every name;
drift shows between rounds), checks that each
record's ``env.ioattn`` is its copy's source digest, and prints each point's median time per name
and its ratio to the first name's. The plots are not kept.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "out" / "packages"

POINT = ("provider", "mode", "headdim", "seqlen_q", "seqlen_k", "batch", "causal")


def apply_patch(patch, dest, what, rev):
    """The package's part of ``patch`` (its ``ioattn/`` files) applied to the copy in ``dest``. git apply
    patches plain files only outside any repository: inside one (the default packages folder is in the
    checkout) it takes paths from the repository's root and skips, without an error, every file outside
    the current folder. The ceiling keeps git from finding the checkout above ``dest``; the check after
    it, that every package file the patch names has changed, keeps a silent no-op from passing as a copy."""
    patch = pathlib.Path(patch).resolve()
    named = sorted({line[6:].strip() for line in patch.read_text().splitlines()
                    if line.startswith("+++ b/ioattn/")})
    before = {f: (dest / f).read_bytes() if (dest / f).exists() else None for f in named}
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(dest.resolve().parent))
    applied = subprocess.run(["git", "apply", "--include=ioattn/*", str(patch)], cwd=dest, env=env,
                             capture_output=True, text=True)
    if applied.returncode:
        raise SystemExit(f"{what} does not apply to {rev}: {applied.stderr.strip()}")
    unchanged = [f for f in named if (dest / f).exists() and (dest / f).read_bytes() == before[f]]
    if unchanged or not named:
        raise SystemExit(f"{what}: no change to {unchanged or 'the package'} in the copy of {rev}")


def prepare(specs, packages=PACKAGES):
    for spec in specs:
        name, _, rev = spec.partition("=")
        rev, _, patch = rev.partition("+")
        if not name or not rev:
            raise SystemExit(f"prepare takes NAME=REV[+PATCH], got {spec!r}")
        dest = packages / name
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        if rev == ".":
            shutil.copytree(ROOT / "ioattn", dest / "ioattn", ignore=shutil.ignore_patterns("__pycache__"))
        else:
            archive = subprocess.run(["git", "archive", rev, "ioattn"], cwd=ROOT, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
        if patch:
            apply_patch(ROOT / patch, dest, f"{name}: {patch}", rev)
        print(f"{name}: {rev}{' + ' + patch if patch else ''} -> {dest}")


def run(names, bench, out, repeat, packages=PACKAGES):
    """{name: [records]} of ``repeat`` rounds over ``names``; raises where a copy's records name other
    sources than its own."""
    sys.path.insert(0, str(ROOT))
    from ioattn.bench.run import source_digest  # here: importing the package imports torch

    out = pathlib.Path(out).resolve()
    records = {name: [] for name in names}
    for r in range(repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:  # each round starts one name later
            home = packages / name
            digest = source_digest(home / "ioattn")
            dest = out / f"{name}-{r}"
            proc = subprocess.run([sys.executable, "-m", "ioattn", "bench", *bench, "--out", str(dest)], cwd=home,
                                  capture_output=True, text=True)
            (out / f"{name}-{r}.log").write_text(proc.stdout + proc.stderr)
            print(f"{name} round {r}: exit {proc.returncode}")
            for png in dest.glob("*.png"):
                png.unlink()
            path = dest / "results.jsonl"
            got = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
            wrong = {rec.get("env", {}).get("ioattn") for rec in got} - {digest}  # (None: a record without env)
            if wrong:
                raise SystemExit(f"{name}: records from sources {sorted(map(str, wrong))}, not its copy's {digest}")
            records[name] += got
    return records


def table(records):
    """Lines: a point's median ms per name (over rounds) and each name's ratio to the first's."""
    names = list(records)
    ms = {}
    for name, recs in records.items():
        for rec in recs:
            if rec.get("ok") and rec.get("ms"):
                ms.setdefault(tuple(rec.get(k) for k in POINT), {}).setdefault(name, []).append(rec["ms"])
    lines = ["  ".join(POINT) + "  " + "  ".join(names)]
    for point, by_name in sorted(ms.items(), key=lambda kv: tuple(map(str, kv[0]))):
        med = {n: statistics.median(v) for n, v in by_name.items()}
        first = med.get(names[0])
        cells = [f"{med[n]:.4g} ms" + (f" ({first / med[n]:.3f}x)" if first and n != names[0] else "")
                 if n in med else "-" for n in names]
        lines.append("  ".join(map(str, point)) + "  " + "  ".join(cells))
    return lines


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    bench = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="copies of ioattn/ under out/packages (default: none)")
    p.add_argument("specs", nargs="+", metavar="NAME=REV")
    p.add_argument("--packages", default=str(PACKAGES), help="where the copies go (default: out/packages)")
    r = sub.add_parser("run", help="one bench sweep over the prepared copies (default: none)")
    r.add_argument("names", nargs="+")
    r.add_argument("--out", required=True, help="results folder (default: none, required)")
    r.add_argument("--repeat", type=int, default=1, help="rounds over the names (default: 1)")
    r.add_argument("--packages", default=str(PACKAGES), help="where the copies are (default: out/packages)")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    packages = pathlib.Path(args.packages)
    if args.cmd == "prepare":
        return prepare(args.specs, packages)
    if not bench:
        ap.error("run needs the bench's sweep and options after --")
    missing = [n for n in args.names if not (packages / n / "ioattn").is_dir()]
    if missing:
        ap.error(f"not prepared: {', '.join(missing)} (run prepare NAME=REV first)")
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    records = run(args.names, bench, args.out, args.repeat, packages)
    lines = table(records)
    (pathlib.Path(args.out) / "table.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
