#!/usr/bin/env bash
# NOTES §160 kept at the products over 192 columns: (1) its GPU test with the width policy (hi first at
# every width against none, bitwise in the ordered mode, both within the oracle), and the padded
# path's backward tests; (2) compute-sanitizer memcheck and racecheck of both passes at d = 192
# (sanitize_small --padded); (3) the project's benchmark at d = 192, the peer in the same run.
# Usage: bash benchmarks/session_gpu_run241.sh OUT   (writes OUT/summary.log, OUT/tests.log,
# OUT/memcheck.log, OUT/racecheck.log, OUT/train.log, OUT/train/)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 150 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "dq_hi_first or (test_hopper_padded and 192)" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 120 python3 -m ioattn bench train --headdims 192 --providers ioattn,sdpa-cudnn --out "$out/train" \
    > "$out/train.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
timeout 140 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --padded --heads 192 \
    > "$out/memcheck.log" 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 ))s: $(grep -E "ERROR SUMMARY|done" "$out/memcheck.log" | tr '\n' ' ')"
t0=$(date +%s)
timeout 150 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_small.py --padded --heads 192 \
    > "$out/racecheck.log" 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 ))s: $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY|done" "$out/racecheck.log" | tr '\n' ' ')"
grep -E "Race reported|at .* in " "$out/racecheck.log" | sort | uniq -c | sort -rn | head -8
grep -A40 "== train sweep" "$out/train.log"
} 2>&1 | tee "$out/summary.log"
