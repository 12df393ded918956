#!/usr/bin/env bash
# Device call G of 2026-12-01 (fifth session): the decode plan with the register cap (WIDE_MAX_REGS):
# (1) the decode plan and tail tests on the GPU; (2) `ioattn bench decode` at batches 17-100 x 4096
# (wave split, tail split, capped launches) with cuDNN, eager and paged.
# Usage: bash benchmarks/session_gpu_run32.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 100 python3 -m pytest tests/test_decode.py tests/test_gpu.py -k "plan or tail or kvcache or paged_load" -n 8 -q \
    -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
mkdir -p "$out/decode_batches"
timeout 150 python3 -m ioattn bench decode --out "$out/decode_batches" --batches 17,24,34,42,48,68,100 --kvlens 4096 \
    --providers ioattn,ioattn-paged,sdpa-cudnn > "$out/decode_batches/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode_batches/*.png
grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
python3 benchmarks/decode_table.py "$out/decode_batches/results.jsonl"
