#!/usr/bin/env bash
# The GPU tests after the oracle check became one helper (tests/test_gpu.py::_assert_out_and_grads):
# the packed and strided-layout tests, and the head-dim tests that reach it through _check.
# Usage: bash benchmarks/session_gpu_run192.sh OUT        (writes OUT/summary.log and OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)  # run190's 30 packed tests: 54 s
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "packed_inputs or layout_without_a_view or test_headdims" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -8
} 2>&1 | tee "$out/summary.log"
