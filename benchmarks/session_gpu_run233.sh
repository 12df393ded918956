#!/usr/bin/env bash
# NOTES §156: compute-sanitizer on the in-place padded kernels with their forms (sanitize_small.py --padded:
# plain, a window, causal softcap + ALiBi, packed sequences with NaN tails): memcheck at d = 80 / 96 / 192,
# racecheck at d = 96.
# Usage: bash benchmarks/session_gpu_run233.sh OUT   (writes OUT/summary.log, OUT/memcheck.log, OUT/racecheck.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 150 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --padded --heads 80,96,192 \
    > "$out/memcheck.log" 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 ))s: $(grep -E "ERROR SUMMARY|done" "$out/memcheck.log" | tr '\n' ' ')"
t0=$(date +%s)
timeout 170 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_small.py --padded --heads 96 \
    > "$out/racecheck.log" 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 ))s: $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY|done" "$out/racecheck.log" | tr '\n' ' ')"
grep -E "Race reported|at .* in " "$out/racecheck.log" | sort | uniq -c | sort -rn | head -8
} 2>&1 | tee "$out/summary.log"
