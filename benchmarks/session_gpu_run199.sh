#!/usr/bin/env bash
# NOTES §144, after the window policy (BWD_WINDOW_MIN_WIDTH from run197 / run198): its GPU test (the plan's
# reason, taken and not, gradients against the oracle), the window tests with softcap / ALiBi (the portable
# backward), and the backward's default-policy and deterministic API tests.
# Usage: bash benchmarks/session_gpu_run199.sh OUT        (writes OUT/summary.log, OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "window_default_policy or window_softcap_alibi or test_backward_default_policy or test_deterministic_through" \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)|Error" "$out/tests.log" | head -12
} 2>&1 | tee "$out/summary.log"
