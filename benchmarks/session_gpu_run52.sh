#!/usr/bin/env bash
# Device call E of 2026-12-01 (eighth session): NOTES §52, the ws backward's loop indices by counters.
# (1) GPU tests of the ws backward with WS_COUNTERS (GQA: the counter's wrap; causal: m_lo > 0);
# (2) ab_bwd: ws against ws-counters, cuDNN in the same run, 3 interleaved rounds, d=128 (d=64 by hand
#     after it, results/session-2026-12-01-zu). The switch was then made the code (NOTES §52).
# Usage: bash benchmarks/session_gpu_run52.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 -m pytest tests/test_gpu.py -k "ws-counters" -n 8 -q -p no:cacheprovider -rfE \
    > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 180 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_d128 --headdims 128 --seqlens 1024,4096,16384 \
    --rounds 3 --providers gluon-ws,gluon-ws-counters,sdpa-cudnn > "$out/ab_bwd_d128.log" 2>&1
echo "ab d128 rc=$?"; grep -A7 "^  d c" "$out/ab_bwd_d128.log"
