#!/usr/bin/env bash
# Device call B of 2026-12-02 (ninth session): NOTES §54.
# (1) GPU tests of the ws backward with the 32 B dQ swizzle (now the default at d = 64 / 128) and with
#     WS_STAGGER (variant "ws-stagger"), Gluon forward feeding; the deterministic tests;
# (2) ab_bwd A/B, 3 interleaved rounds, cuDNN in the same run: default (32 B) / 128 B swizzle / stagger.
# Usage: bash benchmarks/session_gpu_run55.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 240 python3 -m pytest tests/test_gpu.py -k "(test_hopper_backward and ws and gluon) or deterministic" -n 8 -q \
    -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 200 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_d64_128 --headdims 64,128 --seqlens 1024,4096,16384 \
    --rounds 3 --providers gluon-ws,gluon-ws-dq128,gluon-ws-stagger,sdpa-cudnn > "$out/ab_bwd_d64_128.log" 2>&1
echo "ab d64/128 rc=$?"
timeout 120 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_d256 --headdims 256 --seqlens 1024,4096,16384 \
    --rounds 3 --providers gluon-ws,gluon-ws-stagger,sdpa-cudnn > "$out/ab_bwd_d256.log" 2>&1
echo "ab d256 rc=$?"
grep -A13 "^  d c" "$out/ab_bwd_d64_128.log"; grep -A7 "^  d c" "$out/ab_bwd_d256.log"
