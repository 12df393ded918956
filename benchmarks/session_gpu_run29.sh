#!/usr/bin/env bash
# Device call D of 2026-12-01 (fifth session), after the day's kernel and dispatch changes (decode
# tail split and wave split, paged 64-key TMA chunks, d=256 backward dispatched): (1) every GPU test
# (tests/test_gpu.py, test_decode.py, test_merge.py), 8 workers; (2) memcheck on sanitize_small.py
# (the d=256 column-split backward included).
# Usage: bash benchmarks/session_gpu_run29.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 360 python3 -m pytest tests/test_gpu.py tests/test_decode.py tests/test_merge.py -n 8 -q -p no:cacheprovider \
    -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
timeout 150 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py > "$out/sanitizer_memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -n 2 "$out/sanitizer_memcheck.log"
grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 10
