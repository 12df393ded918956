#!/usr/bin/env bash
# Device call C of 2026-12-01 (third session): the decode prefetch (NOTES §30; measured slower and removed
# after this run, so its providers no longer exist).
# (1) the decode GPU tests (the new prefetch tests run on CUDA there); (2) `ioattn bench decode` with
# the prefetch and TMA A/B providers beside the default, its CUDA-graph replay, paged and cuDNN.
# Usage: bash benchmarks/session_gpu_run14.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 120 python3 -m pytest tests/test_decode.py tests/test_gpu.py -k "decode or prefetch" -n 8 -q \
    -p no:cacheprovider -rfE > "$out/test_decode.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_decode.log"
mkdir -p "$out/decode"
timeout 150 python3 -m ioattn bench decode --out "$out/decode" \
    --providers ioattn,ioattn-prefetch,ioattn-tma,ioattn-graph,ioattn-graph-prefetch,ioattn-paged,sdpa-cudnn \
    > "$out/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode/*.png
grep -E "FAILED|ERROR" "$out/test_decode.log" | head -n 6
grep -E "^(ioattn|ioattn-prefetch|ioattn-tma|ioattn-graph|ioattn-graph-prefetch|ioattn-paged|sdpa-cudnn) " \
    "$out/decode.log" | tail -n 49
