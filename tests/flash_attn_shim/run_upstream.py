"""Run a sample of flash-attn's own ``tests/test_flash_attn.py`` against ioattn through the shim.

The test file is not part of ioattn: pass the path of a copy (flash-attn 2.8.x). It is copied into
``--workdir`` (outside the repository) and patched there to run without a GPU:

* ``device = "cuda"`` / ``device="cuda"`` become ``"cpu"``;
* the GPU queries it makes at import and in its skips answer as an H100 would (compute capability
  (9, 0), 80 GiB), so the sm90 branches of its checks apply;
* the repetition loops of the race-condition and determinism tests run ``--repeats`` times instead of
  250 and 50 (the CPU path takes seconds per call at those sizes).

Then ``--per-test`` parametrisations of every test function are drawn at random (``--seed``) from
pytest's collection, run with ``tests/flash_attn_shim`` first on the path (so ``import flash_attn``
is ioattn), and the outcome is summarised per function with the first line of each failure.

    python tests/flash_attn_shim/run_upstream.py /path/to/test_flash_attn.py --workdir /tmp/fa_run

Needs ``einops`` (the test file imports it) and, for ``--timeout``, ``pytest-timeout``.
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SHIM = Path(__file__).resolve().parent
REPO = SHIM.parent.parent

# (pattern, replacement, how many times it must occur at least)
PATCHES = [
    (r'torch\.cuda\.get_device_capability\("cuda"\)', "(9, 0)", 4),
    (r'torch\.cuda\.get_device_properties\("cuda"\)\.total_memory', "(80 * 2**30)", 1),
    (r'device = "cuda"', 'device = "cpu"', 1),
    (r'device="cuda"', 'device="cpu"', 1),
    (r"for i in range\(250\):", "for i in range(REPEATS):", 1),
    (r"for _ in range\(50\):", "for _ in range(REPEATS):", 1),
]


def patch(source: str, repeats: int) -> str:
    for pattern, repl, least in PATCHES:
        source, n = re.subn(pattern, repl, source)
        if n < least:
            raise SystemExit(f"patch {pattern!r} matched {n} times (expected >= {least}): another version?")
    return f"REPEATS = {repeats}\n" + source


def env_for_run() -> dict:
    env = dict(os.environ)
    extra = [str(SHIM), str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join(extra + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def collect(workdir: Path, env: dict) -> list[str]:
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "test_flash_attn.py"], cwd=workdir, env=env, capture_output=True, text=True)
    ids = [line for line in res.stdout.splitlines() if line.startswith("test_flash_attn.py::")]
    if not ids:
        raise SystemExit(f"collection failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return ids


def summarise(junit: Path) -> None:
    per_fn = collections.defaultdict(collections.Counter)
    reasons = collections.defaultdict(collections.Counter)
    seconds = collections.Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        fn = case.get("name").split("[")[0]
        seconds[fn] += float(case.get("time") or 0)
        outcome, reason = "passed", None
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                reason = (el.get("message") or "").splitlines()[0][:160] if el.get("message") else tag
                break
        per_fn[fn][outcome] += 1
        if reason and outcome != "passed":
            reasons[fn][f"{outcome}: {reason}"] += 1
    total = collections.Counter()
    for fn in sorted(per_fn):
        total.update(per_fn[fn])
        print(f"{fn}: " + ", ".join(f"{n} {k}" for k, n in sorted(per_fn[fn].items()))
              + f" ({seconds[fn]:.0f} s)")
        for reason, n in reasons[fn].most_common():
            print(f"    {n} x {reason}")
    print("total: " + ", ".join(f"{n} {k}" for k, n in sorted(total.items())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("test_file", type=Path, help="flash-attn's tests/test_flash_attn.py (2.8.x)")
    ap.add_argument("--workdir", type=Path, required=True, help="a folder outside the repository")
    ap.add_argument("--per-test", type=int, default=30, help="parametrisations drawn per test function")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="iterations of the repetition loops")
    ap.add_argument("--timeout", type=int, default=0, help="seconds per test (pytest-timeout), 0 = none")
    ap.add_argument("--only", default="", help="run only test functions whose name contains this")
    ap.add_argument("--cap", action="append", default=[], metavar="NAME=N",
                    help="draw at most N parametrisations of the test functions whose name contains NAME")
    ap.add_argument("--summarise", type=Path, help="only print the summary of an earlier junit file")
    args = ap.parse_args()
    if args.summarise:
        summarise(args.summarise)
        return
    workdir = args.workdir.resolve()
    if REPO in workdir.parents or workdir == REPO:
        raise SystemExit("--workdir must be outside the repository (flash-attn's file is not ours)")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "test_flash_attn.py").write_text(patch(args.test_file.read_text(), args.repeats))
    env = env_for_run()
    ids = collect(workdir, env)
    by_fn = collections.defaultdict(list)
    for node in ids:
        by_fn[node.split("::")[1].split("[")[0]].append(node)
    caps = [(c.split("=")[0], int(c.split("=")[1])) for c in args.cap]
    rng = random.Random(args.seed)
    chosen = []
    for fn in sorted(by_fn):
        if args.only in fn:
            n = min([args.per_test] + [cap for name, cap in caps if name in fn])
            chosen += rng.sample(by_fn[fn], min(n, len(by_fn[fn])))
    print(f"collected {len(ids)} parametrisations of {len(by_fn)} test functions; running {len(chosen)}")
    (workdir / "selected.txt").write_text("\n".join(chosen) + "\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", "junit.xml",
           "-o", "junit_family=xunit1", "--tb=line", "-rN"]
    if args.timeout:
        cmd += ["--timeout", str(args.timeout)]
    (workdir / "junit.xml").unlink(missing_ok=True)
    subprocess.run(cmd + chosen, cwd=workdir, env=env)
    summarise(workdir / "junit.xml")


if __name__ == "__main__":
    main()
