#!/usr/bin/env bash
# Device call D of 2026-12-01 (fourth session): the decode merge inside the split kernel (NOTES §37).
# (1) the decode GPU tests (every merge mode, CUDA graphs, the fused merge under repetition);
# (2) `ioattn bench decode` with ioattn / ioattn-fused / the graph replays of both / paged / cuDNN.
# Usage: bash benchmarks/session_gpu_run21.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 -m pytest tests/test_gpu.py tests/test_decode.py -k "decode or fused" -n 8 -q \
    -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
mkdir -p "$out/decode"
timeout 200 python3 -m ioattn bench decode --out "$out/decode" \
    --providers ioattn,ioattn-fused,ioattn-graph,ioattn-graph-fused,ioattn-paged,sdpa-cudnn > "$out/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode/*.png
grep -E "FAILED|ERROR|Timeout" "$out/test_gpu.log" | head -n 8
python3 benchmarks/decode_table.py "$out/decode/results.jsonl"
