#!/usr/bin/env bash
# Device call E of 2026-12-02 (ninth session): NOTES §55's default (d=64 at 128 query rows a step)
# through every backward GPU test, and §56 (dK / dV stored as whole rows, WS_COALESCED_STORE):
# (1) GPU tests: the ws backward (Gluon forward feeding) with and without §56, the API-level backward
#     tests, the dispatch policy and the deterministic tests;
# (2) ab_bwd d=64 / 128, default / coalesced / cuDNN, 3 interleaved rounds.
# Usage: bash benchmarks/session_gpu_run58.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 200 python3 -m pytest tests/test_gpu.py -n 8 -q -p no:cacheprovider -rfE \
    -k "(test_hopper_backward and ws and gluon) or through_the_api or backward_default_policy or deterministic" \
    > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 150 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_coal --headdims 64,128 --seqlens 1024,4096,16384 \
    --rounds 3 --providers gluon-ws,gluon-ws-coal,sdpa-cudnn > "$out/ab_bwd_coal.log" 2>&1
echo "ab rc=$?"; grep -A13 "^  d c" "$out/ab_bwd_coal.log"
