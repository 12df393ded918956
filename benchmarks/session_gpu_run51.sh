#!/usr/bin/env bash
# Device call D of 2026-12-01 (eighth session): NOTES §51, dQ added by the consumers' vector reductions.
# (1) GPU tests of the ws backward with WS_DQ_DIRECT (ragged shapes: the masked branch);
# (2) ab_bwd: ws against ws-direct, cuDNN in the same run, 3 interleaved rounds, d=128 and d=64.
#     (WS_DQ_DIRECT, its test variant and the provider were removed after this run: slower, NOTES §51.)
# Usage: bash benchmarks/session_gpu_run51.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 200 python3 -m pytest tests/test_gpu.py -k "ws-direct" -n 8 -q -p no:cacheprovider -rfE \
    > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 220 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_d128 --headdims 128 --seqlens 1024,4096,16384 \
    --rounds 3 --providers gluon-ws,gluon-ws-direct,sdpa-cudnn > "$out/ab_bwd_d128.log" 2>&1
echo "ab d128 rc=$?"; grep -A7 "^  d c" "$out/ab_bwd_d128.log"
timeout 150 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_d64 --headdims 64 --seqlens 1024,4096,16384 \
    --rounds 3 --providers gluon-ws,gluon-ws-direct,sdpa-cudnn > "$out/ab_bwd_d64.log" 2>&1
echo "ab d64 rc=$?"; grep -A7 "^  d c" "$out/ab_bwd_d64.log"
