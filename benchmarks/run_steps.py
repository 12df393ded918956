"""Run a list of shell steps on a GPU machine and keep each one's log: the one runner for device work.

    python benchmarks/run_steps.py OUT [--timeout S] [--total S] ["name=command" ...] [--file STEPS]

Each step runs in the repository root with ``bash -c`` (the root first on ``PYTHONPATH``, output
unbuffered), its output to ``OUT/name.log``; a failing step does not stop the next. A summary line
per step (exit code, seconds, last line of output) goes to stdout and to ``OUT/summary.log``; the
exit code is the number of failed steps. ``--file``: more steps, one ``name=command`` a line after
those given (blank lines and ``#`` comments skipped, a trailing backslash joins the next line).
``--total``: the whole run's seconds: each step's limit is cut to what is left, and a step with less
than ``MIN_STEP`` seconds left is not started (reported with exit code 125), so a command under a
fixed time limit ends inside it with every step's log.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MIN_STEP = 10  # seconds: with less left of --total, a step is not started


def read_steps(path):
    """``name=command`` lines of a steps file (comments, blank lines and continuations handled)."""
    steps, pending = [], ""
    for raw in pathlib.Path(path).read_text().splitlines():
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line and not line.startswith("#"):
            steps.append(line)
    return steps


def run_step(name, command, out, timeout):
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")
    log = out / f"{name}.log"
    t0 = time.time()
    with open(log, "w") as f:
        # a session of its own, so that a step past its time is stopped with everything it started
        proc = subprocess.Popen(["bash", "-c", command], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = 124
    lines = log.read_text(errors="replace").strip().splitlines()
    return rc, time.time() - t0, lines[-1] if lines else ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=pathlib.Path, help="folder for the logs")
    ap.add_argument("steps", nargs="*", help='"name=command" (name: letters, digits, "-", "_")')
    ap.add_argument("--file", type=pathlib.Path, default=None, help="more steps, one a line (default: none)")
    ap.add_argument("--timeout", type=float, default=540, help="seconds per step (default 540)")
    ap.add_argument("--total", type=float, default=None, help="seconds for all the steps (default: no limit)")
    args = ap.parse_intermixed_args(argv)  # steps before and after the options
    steps = list(args.steps) + (read_steps(args.file) if args.file else [])
    for step in steps:
        name, sep, _ = step.partition("=")
        if not sep or not name.replace("-", "").replace("_", "").isalnum():
            ap.error(f"a step is 'name=command', got {step!r}")
    if not steps:
        ap.error("no steps")
    args.out.mkdir(parents=True, exist_ok=True)
    failed, t0 = 0, time.time()
    with open(args.out / "summary.log", "w") as summary:
        for step in steps:
            name, _, command = step.partition("=")
            left = args.timeout if args.total is None else min(args.timeout, args.total - (time.time() - t0))
            if args.total is not None and left < MIN_STEP:
                rc, seconds, last = 125, 0.0, f"not started: {max(left, 0):.0f} s of --total left"
            else:
                rc, seconds, last = run_step(name, command, args.out, left)
            failed += rc != 0
            line = f"{name}: rc={rc} {seconds:.0f}s  {last}"
            print(line, flush=True)
            summary.write(line + "\n")
    return failed


if __name__ == "__main__":
    sys.exit(main())
