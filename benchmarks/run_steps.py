"""Run a list of shell steps on a GPU machine and keep each one's log: the one runner for device work.

    python benchmarks/run_steps.py OUT [--timeout S] "name=command" ["name=command" ...]

Each step runs in the repository root with ``bash -c`` (the root first on ``PYTHONPATH``, output
unbuffered), its output to ``OUT/name.log``; a failing step does not stop the next. A summary line
per step (exit code, seconds, last line of output) goes to stdout and to ``OUT/summary.log``; the
exit code is the number of failed steps.
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
    ap.add_argument("steps", nargs="+", help='"name=command" (name: letters, digits, "-", "_")')
    ap.add_argument("--timeout", type=float, default=540, help="seconds per step (default 540)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    with open(args.out / "summary.log", "w") as summary:
        for step in args.steps:
            name, sep, command = step.partition("=")
            if not sep or not name.replace("-", "").replace("_", "").isalnum():
                ap.error(f"a step is 'name=command', got {step!r}")
            rc, seconds, last = run_step(name, command, args.out, args.timeout)
            failed += rc != 0
            line = f"{name}: rc={rc} {seconds:.0f}s  {last}"
            print(line, flush=True)
            summary.write(line + "\n")
    return failed


if __name__ == "__main__":
    sys.exit(main())
