#!/usr/bin/env bash
# Device call F of 2026-12-01 (third session), after call E's decisions: at least 256 keys per decode
# split, split tiles for paged caches read through pointers, the ordered Gluon backward for
# deterministic non-causal calls. (1) the GPU tests those touch; (2) `ioattn bench decode`.
# Usage: bash benchmarks/session_gpu_run17.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 100 python3 -m pytest tests/test_gpu.py tests/test_decode.py -k "deterministic or decode" -n 6 -q \
    -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
mkdir -p "$out/decode"
timeout 110 python3 -m ioattn bench decode --out "$out/decode" --providers ioattn,ioattn-graph,ioattn-paged,sdpa-cudnn \
    > "$out/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode/*.png
grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 6
grep -E "^(ioattn|ioattn-graph|ioattn-paged|sdpa-cudnn) " "$out/decode.log" | tail -n 28
