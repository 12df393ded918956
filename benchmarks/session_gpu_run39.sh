#!/usr/bin/env bash
# Device call G of 2026-12-01 (sixth session): NOTES §44, the power-of-two split count (33 -> 32 at
# batch 1) and the merge's one-load path. (1) decode / merge GPU tests; (2) decode_timeline.py A/B
# (3 interleaved rounds): the new default against 33 splits, cuDNN beside; (3) `ioattn bench decode`.
# Usage: bash benchmarks/session_gpu_run39.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 200 python3 -m pytest tests/test_decode.py tests/test_merge.py tests/test_gpu.py \
    -k "decode or kvcache or paged or tail or plan or split or merge" -n 8 -q -p no:cacheprovider -rfE \
    > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 150 python3 benchmarks/decode_timeline.py --out "$out/decode_ab.json" --calls 10 \
    --cases 1x4096,1x16384,1x65536,1x131072,8x8192 --providers ioattn,ioattn+num_splits=33,sdpa-cudnn \
    > "$out/decode_ab.log" 2>&1
echo "timeline rc=$?"
grep "bench timing" "$out/decode_ab.log" | sed 's/; /\n    /g'
grep -v -i warn "$out/decode_ab.log" | grep -A2 "span" | grep -v "^--" | grep -E "span|merge|lean|split_kernel|cudnn_gen" \
    | awk '{print $1, $2, $3, $4, $5, $6}'
mkdir -p "$out/decode"
timeout 200 python3 -m ioattn bench decode --out "$out/decode" --providers ioattn,ioattn-paged,sdpa-cudnn \
    > "$out/decode/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode/*.png
python3 benchmarks/decode_table.py "$out/decode/results.jsonl"
