#!/usr/bin/env bash
# The varlen backward GPU tests after their inputs moved into one helper (tests/test_gpu.py::_ragged_packed).
# Usage: bash benchmarks/session_gpu_run200.sh OUT        (writes OUT/summary.log, OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)  # run196's 84 window + varlen tests: 75 s
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "backward_varlen" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
} 2>&1 | tee "$out/summary.log"
