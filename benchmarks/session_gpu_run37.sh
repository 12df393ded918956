#!/usr/bin/env bash
# Device call E of 2026-12-01 (sixth session): NOTES §44. (1) the decode GPU tests with split
# boundaries on 16-key multiples (the new default on contiguous caches); (2) decode_timeline.py A/B,
# the bench's timing in 3 interleaved rounds: new default / old chunk-aligned splits / each with the
# merge released after the key loop (PDL_LATE) / cuDNN, at batch 1 x 4k..128k and 8 x 8192.
# (The split_keys field was removed after this run: it lost at 1 x 64k, NOTES §44.)
# (The early release and its pdl_late field were removed after run 37: the late release is the
# kernel's only form now, NOTES §44.)
# Usage: bash benchmarks/session_gpu_run37.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 240 python3 -m pytest tests/test_decode.py tests/test_gpu.py -k "decode or kvcache or paged or tail or plan or split" \
    -n 8 -q -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 240 python3 benchmarks/decode_timeline.py --out "$out/decode_ab.json" \
    --cases 1x4096,1x16384,1x65536,1x131072,8x8192 \
    --providers ioattn,ioattn+split_keys=128,ioattn+pdl_late=1,ioattn+pdl_late=1+split_keys=128,sdpa-cudnn \
    > "$out/decode_ab.log" 2>&1
echo "timeline rc=$?"
grep -v -i "warn" "$out/decode_ab.log" | grep -E "bench timing" | sed 's/; /\n    /g'
grep -v -i "warn" "$out/decode_ab.log" | grep -E "^[a-z].*span|decode_split" | paste - - | awk '{print $1, $2, $4, $10, $11}'
