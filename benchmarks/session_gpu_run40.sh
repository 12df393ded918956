#!/usr/bin/env bash
# Device call H of 2026-12-01 (sixth session): NOTES §45, the split kernel launched by PDL itself.
# (1) decode GPU tests (graph capture with the append in front, long caches, bit-identical);
# (2) decode_timeline.py A/B at the table's 7 cases: default / pdl_wait=1 / cuDNN, 3 interleaved rounds;
# (3) `ioattn bench decode` with IOATTN_DECODE_PDL_WAIT=1 (the candidate default).
# Usage: bash benchmarks/session_gpu_run40.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 -m pytest tests/test_gpu.py tests/test_decode.py -k "decode_step_cuda_graph or decode_long_cache or pdl" \
    -n 8 -q -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 150 python3 benchmarks/decode_timeline.py --out "$out/decode_ab.json" --calls 10 \
    --cases 1x4096,1x16384,1x65536,1x131072,8x8192,32x32768,64x4096 \
    --providers ioattn,ioattn+pdl_wait=1,sdpa-cudnn > "$out/decode_ab.log" 2>&1
echo "timeline rc=$?"
grep "bench timing" "$out/decode_ab.log" | sed 's/; /\n    /g'
grep -v -i warn "$out/decode_ab.log" | grep -A1 "span" | grep -v "^--" | awk '{print $1, $2, $3, $4, $5, $6}' | paste - -
mkdir -p "$out/decode"
IOATTN_DECODE_PDL_WAIT=1 timeout 150 python3 -m ioattn bench decode --out "$out/decode" \
    --providers ioattn,ioattn-paged,sdpa-cudnn > "$out/decode/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode/*.png
python3 benchmarks/decode_table.py "$out/decode/results.jsonl"
