#!/usr/bin/env bash
# Device call C of 2026-12-01 (fifth session): (1) the d=256 ws backward's GPU tests (column split,
# NOTES §40; under timeout: a wrong barrier protocol hangs); (2) its ab_bwd against the portable
# backward and cuDNN at N=4096 / 16384; (3) ab_decode --cases near (batches 17-24 x 4096) and the
# decode plan tests on the GPU.
# Usage: bash benchmarks/session_gpu_run28.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 240 python3 -m pytest tests/test_gpu.py -k "hopper_backward and 256 and not base" -n 8 -q -p no:cacheprovider \
    -rfE -x > "$out/test_gpu_d256.log" 2>&1
echo "d256 tests rc=$?"; tail -n 1 "$out/test_gpu_d256.log"
timeout 200 python3 benchmarks/ab_bwd.py --out "$out" --headdims 256 --seqlens 4096,16384 --causal 0,1 \
    --providers portable,gluon-ws,gluon-ws-det,sdpa-cudnn --tag ab_bwd_d256 > "$out/ab_bwd_d256.log" 2>&1
echo "ab_bwd rc=$?"
timeout 120 python3 benchmarks/ab_decode.py --out "$out" --cases near --rounds 2 > "$out/ab_decode_near.log" 2>&1
echo "near rc=$?"
timeout 100 python3 -m pytest tests/test_decode.py -k "plan or tail" -q -p no:cacheprovider >> "$out/test_gpu_d256.log" 2>&1
echo "decode plan tests rc=$?"
grep -E "FAILED|ERROR|Timeout" "$out/test_gpu_d256.log" | head -n 8
tail -n 12 "$out/ab_bwd_d256.log"
grep -A30 "median over rounds" "$out/ab_decode_near.log"
