#!/usr/bin/env bash
# Last device call of the sixteenth session (2026-12-02), with its remaining seconds: racecheck on the
# kernels at d = 128 (sanitize_small.py: every forward variant, now with Q as S = Q K^T's register
# operand, a shared-memory read a query tile; the backward; decode), the report locations counted.
# Usage: bash benchmarks/session_gpu_run100.sh OUT        (writes OUT/summary.log, OUT/sanitizer_racecheck.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 175 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_small.py --heads 128 \
    > "$out/sanitizer_racecheck.log" 2>&1
echo "sanitizer racecheck rc=$?"; tail -n 2 "$out/sanitizer_racecheck.log"
grep -h -o "at [a-z_]*+0x[0-9a-f]* in [a-z_]*.py:[0-9]*" "$out"/sanitizer_racecheck.log | sed 's/+0x[0-9a-f]*//' \
    | sort | uniq -c
} 2>&1 | tee "$out/summary.log"
