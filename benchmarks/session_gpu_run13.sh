#!/usr/bin/env bash
# Device call B of 2026-12-01 (third session), after the dispatch changes of call A's data
# (wg3 at d=64 by AUTO_MIN_SEQLEN, the "ws" backward by BWD_AUTO_MIN_SEQLEN, paged decode TMA with
# many splits): (1) every GPU test, 8 workers; (2) `ioattn bench train` at head dims 64/128 with
# the new default dispatch beside SDPA flash and cuDNN (the README's figures); (3) `ioattn bench decode`.
# Usage: bash benchmarks/session_gpu_run13.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 210 python3 -m pytest tests/test_gpu.py tests/test_decode.py tests/test_merge.py -n 8 -q -p no:cacheprovider \
    -rfEs > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
mkdir -p "$out/train"
timeout 200 python3 -m ioattn bench train --headdims 64,128 --providers ioattn,sdpa-flash,sdpa-cudnn \
    --out "$out/train" > "$out/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
mkdir -p "$out/decode"
timeout 90 python3 -m ioattn bench decode --out "$out/decode" > "$out/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode/*.png
grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 8
grep -E "^(ioattn|sdpa-cudnn) " "$out/train.log" | grep "n=16384" | head -n 24
grep -E "^(ioattn|ioattn-paged|ioattn-graph|sdpa-cudnn) " "$out/decode.log" | tail -n 28
