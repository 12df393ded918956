#!/usr/bin/env bash
# Last device call of the fifteenth session (2026-12-02), with the session's remaining seconds: the
# Gluon forward's varlen GPU tests under NOTES §84's default (conditional rescaling by the warp), which
# runs 93-95 did not cover.
# Usage: bash benchmarks/session_gpu_run96.sh OUT        (writes OUT/summary.log and OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 100 python3 -m pytest -q -n 12 tests/test_gpu.py -p no:cacheprovider -k "varlen and (hopper or gluon)" \
    > "$out/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -8
} 2>&1 | tee "$out/summary.log"
