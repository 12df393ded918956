#!/usr/bin/env bash
# Device call E of 2026-12-01 (third session): (1) the ws backward's ordered (deterministic) dQ mode:
# its GPU tests under a timeout (a semaphore mistake would hang); (2) its cost, ab_bwd gluon-ws vs
# gluon-ws-det vs the portable backward at d=128; (3) benchmarks/ab_decode.py (split counts at batch 1
# x 4096 eager and replayed; paged tiles at batch 8 x 8192), with cuDNN.
# Usage: bash benchmarks/session_gpu_run16.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 130 python3 -m pytest tests/test_gpu.py -k "deterministic" -n 6 -q -p no:cacheprovider -rfE \
    > "$out/test_det.log" 2>&1
echo "det tests rc=$?"; tail -n 1 "$out/test_det.log"
timeout 50 python3 benchmarks/ab_bwd.py --out "$out" --providers portable,gluon-ws,gluon-ws-det --headdims 128 \
    --seqlens 4096,16384 > "$out/ab_bwd.log" 2>&1
echo "ab_bwd rc=$?"
timeout 120 python3 benchmarks/ab_decode.py --out "$out" > "$out/ab_decode.log" 2>&1
echo "ab_decode rc=$?"
grep -E "FAILED|ERROR|Timeout" "$out/test_det.log" | head -n 6
tail -n 5 "$out/ab_bwd.log"; cat "$out/ab_decode.log" | tail -n 20
