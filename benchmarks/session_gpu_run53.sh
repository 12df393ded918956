#!/usr/bin/env bash
# Device call for the next session (written 2026-12-01, eighth session; NOTES §52 / §53), first:
# (1) the deterministic backward's GPU tests (its consumers took §52's counters without a device run);
# (2) the d=256 column-split backward with WS_D256_COUNTERS: its GPU tests, then the A/B against the
#     division build, cuDNN in the same run, 3 interleaved rounds.
# Usage: bash benchmarks/session_gpu_run53.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 200 python3 -m pytest tests/test_gpu.py -k "deterministic or (ws-counters and 256)" -n 8 -q -p no:cacheprovider \
    -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 240 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_d256 --headdims 256 --seqlens 1024,4096,16384 \
    --rounds 3 --providers gluon-ws,gluon-ws-counters,sdpa-cudnn > "$out/ab_bwd_d256.log" 2>&1
echo "ab d256 rc=$?"; grep -A7 "^  d c" "$out/ab_bwd_d256.log"
