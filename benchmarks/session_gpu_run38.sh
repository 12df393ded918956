#!/usr/bin/env bash
# Device call F of 2026-12-01 (sixth session): `ioattn bench decode` with the merge released after the
# split programs' key loop (the new default, NOTES §44): the table (3 interleaved rounds) and the
# off-table batches 17 / 68 / 100 x 4096, against cuDNN, eager / graph / paged.
# Usage: bash benchmarks/session_gpu_run38.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$out/decode" "$out/decode_batches"
timeout 240 python3 -m ioattn bench decode --out "$out/decode" --providers ioattn,ioattn-paged,sdpa-cudnn \
    > "$out/decode/decode.log" 2>&1
echo "decode rc=$?"
timeout 150 python3 -m ioattn bench decode --out "$out/decode_batches" --batches 17,68,100 --kvlens 4096 \
    --providers ioattn,ioattn-paged,sdpa-cudnn > "$out/decode_batches/decode.log" 2>&1
echo "batches rc=$?"; rm -f "$out"/decode*/*.png
for f in "$out/decode/results.jsonl" "$out/decode_batches/results.jsonl"; do
    python3 benchmarks/decode_table.py "$f"
done
