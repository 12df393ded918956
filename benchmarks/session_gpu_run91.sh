#!/usr/bin/env bash
# Eighth device call of the fourteenth session (2026-12-02): the decode GPU tests after the load-path
# policy test learned the paged one-wave launch (NOTES §81).
# Usage: bash benchmarks/session_gpu_run91.sh OUT        (writes OUT/summary.log and OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "decode" -rA > "$out/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$out/tests.log")" | tee "$out/summary.log"
grep -E "^(PASSED|FAILED|ERROR)" "$out/tests.log" | grep -c one_wave | sed 's/^/one-wave tests passed or failed: /' | tee -a "$out/summary.log"
