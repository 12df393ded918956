#!/usr/bin/env bash
# NOTES §157, the forward's products over 192 of d = 256's columns at padded head dims 136-192
# (hopper.split_cols, the kernel's PROD_DIM): (1) the GPU tests of the padded path with it (d = 136 /
# 192 through flash_attn_func against the float64 oracle; split against the 256-wide products bitwise,
# d = 136 / 160 / 192, persistent and ping-pong; in place against the copies; the forms, packed
# sequences); (2) ab_padded.py's forward A/B, split ("gluon-pad") against the wide products
# ("gluon-pad-wide"), cuDNN in the same process.
# Usage: bash benchmarks/session_gpu_run234.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/ab_padded.*)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 230 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "test_hopper_padded or test_hopper_split_cols" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 300 python3 benchmarks/ab_padded.py --out "$out" --passes fwd --headdims 160,192 \
    --seqlens 512,1024,2048,4096,16384 --providers gluon-pad,gluon-pad-wide,sdpa-cudnn > "$out/ab_padded.log" 2>&1
echo "ab_padded rc=$? $(( $(date +%s) - t0 ))s"
grep -vE "^(fwd|bwd|pass) " "$out/ab_padded.log" | head -20
grep -E "^(fwd|bwd|pass) " "$out/ab_padded.log"
} 2>&1 | tee "$out/summary.log"
