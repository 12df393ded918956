#!/usr/bin/env bash
# Sixth device call of the fourteenth session (2026-12-02): the final decode code. (1) GPU tests of
# decode; (2) `ioattn bench decode` (issue 4's table) with the graph and paged providers and cuDNN;
# (3) the same bench over batches 17-100 x 4096 (the plan's rules: wave split, tail split, register
# caps, the one-wave launch), paged and cuDNN beside.
# Usage: bash benchmarks/session_gpu_run89.sh OUT        (writes OUT/summary.log and OUT/run89.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w/decode" "$w/batches"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 120 python3 -m pytest -q -x -n 8 tests/test_gpu.py -p no:cacheprovider -k "decode" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
timeout 180 python3 -m ioattn bench decode --out "$w/decode" --providers ioattn,ioattn-graph,ioattn-paged,sdpa-cudnn \
    > "$w/decode/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$w"/decode/*.png
python3 benchmarks/decode_table.py "$w/decode/results.jsonl"
timeout 180 python3 -m ioattn bench decode --out "$w/batches" --providers ioattn,ioattn-paged,sdpa-cudnn \
    --batches 17,24,34,42,48,50,52,56,64,67,68,72,80,100 --kvlens 4096 > "$w/batches/decode.log" 2>&1
echo "batches rc=$?"; rm -f "$w"/batches/*.png
python3 benchmarks/decode_table.py "$w/batches/results.jsonl"
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run89.tar.gz" -C "$w" . && rm -rf "$w"
