#!/usr/bin/env bash
# A regression subset of the GPU tests after §148 (the API's backward, the default dispatch and policies, head dims,
# ragged causal, deterministic, negative scale, the TMA forward), plus d = 128's first-shape ALiBi tests (run214
# only). Run as commands on the device: run213 without the ALiBi term (48 failed: the ws backward's None slopes
# pointer, NOTES §148), run214 with it after the fix (85 passed). run210b was session_gpu_run210.sh's test step alone.
# Usage: bash benchmarks/session_gpu_run213.sh OUT   (writes OUT/summary.log, OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 240 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "through_the_api or default_policy or \
default_dispatch or headdims or ragged_causal or window_softcap_alibi or negative_scale or deterministic_through_the_api \
or test_deterministic_backward or test_tma_forward or (hopper_alibi and shape0 and 128)" > "$out/tests.log" 2>&1
echo "regression subset rc=$?: $(tail -n 1 "$out/tests.log")" | tee "$out/summary.log"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head
