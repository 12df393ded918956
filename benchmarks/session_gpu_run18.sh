#!/usr/bin/env bash
# Device call A of 2026-12-01 (fourth session): what was compiled but never run.
# (1) GPU tests of the persistent Gluon forward (NOTES §35) and the deterministic backward, causal
#     descending order included (§34); (2) ab_fwd: TMA portable / ping-pong / persistent at d=128/256;
# (3) ab_bwd: portable / ws / ws ordered at d=128, both masks.
# Usage: bash benchmarks/session_gpu_run18.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 170 python3 -m pytest tests/test_gpu.py -k "persistent or deterministic" -n 8 -q \
    -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
timeout 150 python3 benchmarks/ab_fwd.py --out "$out" --loads tma,gluon-pp,gluon-pers --headdims 128,256 \
    --seqlens 512,2048,16384 > "$out/ab_fwd.log" 2>&1
echo "ab_fwd rc=$?"
timeout 80 python3 benchmarks/ab_bwd.py --out "$out" --providers portable,gluon-ws,gluon-ws-det --headdims 128 \
    --seqlens 4096,16384 > "$out/ab_bwd.log" 2>&1
echo "ab_bwd rc=$?"
grep -E "FAILED|ERROR|Timeout" "$out/test_gpu.log" | head -n 8
grep -E "Error|error" "$out/ab_fwd.log" | head -n 4
tail -n 14 "$out/ab_fwd.log"; tail -n 6 "$out/ab_bwd.log"
