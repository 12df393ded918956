#!/usr/bin/env bash
# NOTES §159, dQ's high half at 64 columns in the split backward (after §158): (1) the GPU
# tests of the padded path with both passes split (split against wide bitwise, forward and ordered
# backward, d = 136 / 160 / 192; the padded tests through flash_attn_func, forms, packed sequences); (2)
# ab_padded.py's backward A/B, split ("gluon-pad") against wide ("gluon-pad-wide"), cuDNN in the same
# process; (3) compute-sanitizer memcheck of both passes at d = 192 (sanitize_small --padded).
# Usage: bash benchmarks/session_gpu_run238.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/ab_padded.*,
# OUT/memcheck.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "test_hopper_padded or test_hopper_split_cols" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 200 python3 benchmarks/ab_padded.py --out "$out" --passes bwd --headdims 160,192 \
    --seqlens 512,1024,2048,4096,16384 --providers gluon-pad,gluon-pad-wide,sdpa-cudnn > "$out/ab_padded.log" 2>&1
echo "ab_padded rc=$? $(( $(date +%s) - t0 ))s"
grep -vE "^(fwd|bwd|pass) " "$out/ab_padded.log" | head -20
t0=$(date +%s)
timeout 150 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --padded --heads 192 \
    > "$out/memcheck.log" 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 ))s: $(grep -E "ERROR SUMMARY|done" "$out/memcheck.log" | tr '\n' ' ')"
grep -E "^(fwd|bwd|pass) " "$out/ab_padded.log"
} 2>&1 | tee "$out/summary.log"
