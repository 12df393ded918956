#!/usr/bin/env bash
# Device call C of 2026-12-01 (fourth session), after call A: the persistent forward's causal tiles
# in LPT order with odd waves reversed, the one-tile kernels' optional LPT grid (NOTES §36), the
# causal deterministic backward dispatched to the ordered Gluon mode.
# (1) GPU tests of those; (2) ab_fwd: ping-pong / ping-pong LPT / persistent (and wg3 at d=64) over
# head dims 64/128/256, N = 512..16384, both masks.
# Usage: bash benchmarks/session_gpu_run20.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 170 python3 -m pytest tests/test_gpu.py -k "persistent or lpt or deterministic" -n 8 -q \
    -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
timeout 330 python3 benchmarks/ab_fwd.py --out "$out" --loads gluon-pp,gluon-pp-lpt,gluon-pers,gluon-wg3,gluon-wg3-lpt \
    --headdims 64,128,256 --seqlens 512,1024,2048,4096,16384 > "$out/ab_fwd.log" 2>&1
echo "ab_fwd rc=$?"
grep -E "FAILED|ERROR|Timeout" "$out/test_gpu.log" | head -n 8
grep -E "^[0-9 ]+[01] +[0-9]+ " "$out/ab_fwd.log" | tail -n 32
