#!/usr/bin/env bash
# Last device call of the seventeenth session (2026-12-02), with its remaining seconds: the Gluon
# forward's GPU suite under the session's defaults (the row sum deferred in the ping-pong and
# persistent kernels at d = 128 / 256 and in wg3 non-causal): every variant, head dim, mask and dtype
# of test_hopper_forward, varlen, the next batch element's rows, the negative scale, the persistent
# tile loop, LPT order, fewer masks, the output staged via Q, and the backward through the API.
# Usage: bash benchmarks/session_gpu_run107.sh OUT        (writes OUT/summary.log and OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 330 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider \
    -k "(test_hopper_forward or backward_through_the_api) and not exp2_fma and not conditional_rescale and not accumulator_stores and not one_release and not q_in_registers and not deferred_row_sum" \
    > "$out/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
} 2>&1 | tee "$out/summary.log"
