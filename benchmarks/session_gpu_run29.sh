#!/usr/bin/env bash
# Device call D of 2026-12-01 (fifth session), after the day's kernel and dispatch changes (decode
# tail / wave splits and the stream-K partition, paged 64-key TMA chunks, d=256 backward dispatched):
# (1) every GPU test (tests/test_gpu.py, test_decode.py, test_merge.py), 8 workers; (2) ab_decode
# --cases streamk (stream-K at 132 / 264 / 396 programs against the default plan, cuDNN beside);
# (3) memcheck on the kernels new this session (sanitize_small.py --heads 256 --no-forward: the
# d=256 column-split backward, the decode tail split and stream-K).
# Usage: bash benchmarks/session_gpu_run29.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 320 python3 -m pytest tests/test_gpu.py tests/test_decode.py tests/test_merge.py -n 8 -q -p no:cacheprovider \
    -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
timeout 150 python3 benchmarks/ab_decode.py --out "$out" --cases streamk --rounds 2 > "$out/ab_decode_streamk.log" 2>&1
echo "streamk rc=$?"
timeout 80 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --heads 256 --no-forward \
    > "$out/sanitizer_memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -n 2 "$out/sanitizer_memcheck.log"
grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 10
grep -A40 "median over rounds" "$out/ab_decode_streamk.log"
