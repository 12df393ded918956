#!/usr/bin/env bash
# Device call E of 2026-12-01 (fifth session): the benchmarks after the day's changes.
# (1) `ioattn bench decode` (issue 4's table: ioattn eager / graph replay / paged, cuDNN);
# (2) the same at batches 17, 24, 34, 68, 100 x 4096 (the wave and tail splits);
# (3) `ioattn bench train --headdims 256` (the d=256 backward through the dispatch, cuDNN beside).
# Usage: bash benchmarks/session_gpu_run30.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$out/decode" "$out/decode_batches" "$out/train256"
timeout 200 python3 -m ioattn bench decode --out "$out/decode" \
    --providers ioattn,ioattn-graph,ioattn-paged,sdpa-cudnn > "$out/decode/decode.log" 2>&1
echo "decode rc=$?"
timeout 120 python3 -m ioattn bench decode --out "$out/decode_batches" --batches 17,24,34,68,100 --kvlens 4096 \
    --providers ioattn,ioattn-paged,sdpa-cudnn > "$out/decode_batches/decode.log" 2>&1
echo "decode batches rc=$?"
timeout 230 python3 -m ioattn bench train --headdims 256 --providers ioattn,sdpa-cudnn \
    --out "$out/train256" > "$out/train256/train.log" 2>&1
echo "train rc=$?"
rm -f "$out"/*/*.png
for d in decode decode_batches; do
python3 benchmarks/decode_table.py "$out/$d/results.jsonl"
done
grep -v "^wrote" "$out/train256/train.log" | tail -n 30
