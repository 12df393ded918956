#!/usr/bin/env bash
# NOTES §155: run226's dispatch tests again after the in-place padded path (the launchers, the backward's
# preprocess kernel and dQ conversion took new arguments; the default builds compile to the same PTX).
# Usage: bash benchmarks/session_gpu_run230.sh OUT   (writes OUT/summary.log, OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 420 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "through_the_api or default_dispatch or default_policy or test_deterministic or test_window_softcap_alibi or test_large_index or test_tma_forward or test_decode or hopper_layout_without_a_view or packed_inputs_without_copy or test_hopper_backward_varlen or test_hopper_forward_varlen" \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
} 2>&1 | tee "$out/summary.log"
