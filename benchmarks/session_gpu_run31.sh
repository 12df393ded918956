#!/usr/bin/env bash
# Device call F of 2026-12-01 (fifth session): the stream-K decode again after its compile fix
# (call D: the JIT's int64 unit index broke the window branch's types): (1) the stream-K and plan
# GPU tests and the tests that failed in D; (2) ab_decode --cases streamk; (3) memcheck on the
# kernels new this session.
# Usage: bash benchmarks/session_gpu_run31.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 -m pytest tests/test_decode.py tests/test_gpu.py -k "stream_k or tail or plan or paged_load_path" \
    -n 8 -q -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
timeout 170 python3 benchmarks/ab_decode.py --out "$out" --cases streamk --rounds 2 > "$out/ab_decode_streamk.log" 2>&1
echo "streamk rc=$?"
timeout 80 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --heads 256 --no-forward \
    > "$out/sanitizer_memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -n 2 "$out/sanitizer_memcheck.log"
grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 10
grep -A40 "median over rounds" "$out/ab_decode_streamk.log"
