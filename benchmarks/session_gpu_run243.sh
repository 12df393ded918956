#!/usr/bin/env bash
# NOTES §161 adopted (hopper.split_ring on at the products over 192 columns): (1) the GPU tests of the
# padded path (the ring against the whole tiles bitwise; the padded head dims, forms, packed sequences
# and the API's plan with the ring on by default); (2) compute-sanitizer memcheck and racecheck at d =
# 192 (sanitize_small --padded: the forward also at whole key tiles, the ring); (3) the project's
# benchmark at d = 160 / 192, the peer in the same run.
# Usage: bash benchmarks/session_gpu_run243.sh OUT   (writes OUT/summary.log, OUT/tests.log,
# OUT/memcheck.log, OUT/racecheck.log, OUT/train.log, OUT/train/)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 200 python3 -m ioattn bench train --headdims 192,160 --providers ioattn,sdpa-cudnn --out "$out/train" \
    > "$out/train.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
timeout 180 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "split_ring or test_hopper_split_cols or test_hopper_padded or dq_hi_first" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 100 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --padded --heads 192 \
    > "$out/memcheck.log" 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 ))s: $(grep -E "ERROR SUMMARY|done" "$out/memcheck.log" | tr '\n' ' ')"
t0=$(date +%s)
timeout 100 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_small.py --padded --heads 192 \
    > "$out/racecheck.log" 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 ))s: $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY|done" "$out/racecheck.log" | tr '\n' ' ')"
grep -E "Race reported|at .* in " "$out/racecheck.log" | awk '{print $NF}' | sort | uniq -c | sort -rn | head -6
grep -A80 "== train sweep" "$out/train.log" | grep -E " fwd | bwd |== train"
} 2>&1 | tee "$out/summary.log"
