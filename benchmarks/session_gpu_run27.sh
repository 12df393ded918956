#!/usr/bin/env bash
# Device call B of 2026-12-01 (fifth session): the decode tail split and the paged block-table reads
# (NOTES §40). (1) the decode GPU tests (test_decode.py runs its kernels on the GPU here, the forced
# tail splits and lookup modes included); (2) ab_decode --cases tail (on / off, batches 17-100 x
# 4096, cuDNN beside); (3) ab_decode --cases lookup (paged read modes, batch 1 x 4096 / 16k, 8 x 8192).
# Usage: bash benchmarks/session_gpu_run27.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 200 python3 -m pytest tests/test_decode.py tests/test_merge.py tests/test_gpu.py -k "decode or merge or tail or lookup or kvcache" \
    -n 8 -q -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
timeout 150 python3 benchmarks/ab_decode.py --out "$out" --cases tail --rounds 2 > "$out/ab_decode_tail.log" 2>&1
echo "tail rc=$?"
timeout 150 python3 benchmarks/ab_decode.py --out "$out" --cases lookup --rounds 3 > "$out/ab_decode_lookup.log" 2>&1
echo "lookup rc=$?"
grep -E "FAILED|ERROR|Timeout" "$out/test_gpu.log" | head -n 8
grep -A40 "median over rounds" "$out/ab_decode_tail.log"
grep -A40 "median over rounds" "$out/ab_decode_lookup.log"
