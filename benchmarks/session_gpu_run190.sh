#!/usr/bin/env bash
# NOTES §141: the varlen packed test (flash_attn_varlen_qkvpacked_func through the Gluon varlen forward,
# in place) with the batched packed tests again.
# Usage: bash benchmarks/session_gpu_run190.sh OUT        (writes OUT/summary.log and OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)  # the packed tests: part of run188's 72 s
timeout 240 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "packed_inputs" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -8
} 2>&1 | tee "$out/summary.log"
