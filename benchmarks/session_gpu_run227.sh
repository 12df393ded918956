#!/usr/bin/env bash
# NOTES §155, padded head dims read in place (hopper.padded_in_place: 3-D descriptors whose TMA boxes
# run past d, the stores masked to d): (1) the GPU tests of the padded path (in place at d = 80 / 96 / 192,
# the copies at d = 100; in place against the copies bitwise, forward and ordered backward, persistent
# and ping-pong; test_headdims / test_ragged_causal through the default dispatch; the backward through
# the API); (2) compute-sanitizer memcheck of the in-place forward (persistent, ping-pong) and ws
# backward (plain, ordered) at d = 80 / 96 / 192.
# Usage: bash benchmarks/session_gpu_run227.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/memcheck.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 260 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "test_hopper_padded or test_headdims or test_ragged_causal or test_hopper_backward_through_the_api" \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 240 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --padded --heads 80,96,192 \
    > "$out/memcheck.log" 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 ))s: $(grep -E "ERROR SUMMARY|done" "$out/memcheck.log" | tr '\n' ' ')"
} 2>&1 | tee "$out/summary.log"
