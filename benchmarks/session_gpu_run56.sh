#!/usr/bin/env bash
# Device call C of 2026-12-02 (ninth session): NOTES §55, the d=64 backward with 128 query rows a step.
# (1) GPU tests: the ws-m128 variant (float64 oracle, every shape / mask / dtype) and the deterministic
#     tests at both row counts; (2) ab_bwd d=64, default / m128 / cuDNN, 3 interleaved rounds.
# Usage: bash benchmarks/session_gpu_run56.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 200 python3 -m pytest tests/test_gpu.py -k "ws-m128 or test_hopper_backward_deterministic" -n 8 -q \
    -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 150 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_d64 --headdims 64 --seqlens 1024,4096,16384 \
    --rounds 3 --providers gluon-ws,gluon-ws-m128,sdpa-cudnn > "$out/ab_bwd_d64.log" 2>&1
echo "ab d64 rc=$?"; grep -A7 "^  d c" "$out/ab_bwd_d64.log"
