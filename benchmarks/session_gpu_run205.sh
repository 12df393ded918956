#!/usr/bin/env bash
# The Gluon forward's fixed-length and varlen GPU tests after the launcher learnt windows (NOTES §145):
# the main variant test, varlen, next-batch rows, negative scale, the persistent tile loop and the
# unmasked keys (their kernels compile to the same instructions; this checks the launcher's arguments).
# Usage: bash benchmarks/session_gpu_run205.sh OUT        (writes OUT/summary.log, OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 450 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "(test_hopper_forward[ or hopper_forward_varlen or next_batch or negative_scale or persistent_tile_loop or unmasked_keys) and not window" \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
} 2>&1 | tee "$out/summary.log"
