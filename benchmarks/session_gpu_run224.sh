#!/usr/bin/env bash
# NOTES §154, the padded head dims as implemented (hopper.padded_headdim, pad_head: one concatenation a
# tensor; PADDED_MIN_SEQLEN from run223's F.pad figures): (1) the GPU tests (test_hopper_padded_head_dims:
# d = 80 / 96 / 192, both masks, three shapes, transposed inputs, the ordered mode; test_headdims and
# test_ragged_causal through the default dispatch); (2) ab_padded.py with the launchers' path
# ("gluon-pad"), run223's F.pad form ("gluon-fpad"), the default dispatch, the portable kernels and SDPA,
# N = 512 to 16384 (2048 and 8192 added), both masks, forward and backward.
# Usage: bash benchmarks/session_gpu_run224.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/ab_padded.{log,jsonl})
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 150 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "test_hopper_padded_head_dims or test_headdims or test_ragged_causal" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 420 python3 benchmarks/ab_padded.py --out "$out" --seqlens 512,1024,2048,4096,8192,16384 \
    --providers ioattn,portable,gluon-pad,gluon-fpad,sdpa-cudnn > "$out/ab_padded.log" 2>&1
echo "ab_padded rc=$? $(( $(date +%s) - t0 ))s"
grep -vE "^(fwd|bwd|pass) " "$out/ab_padded.log" | head -20
grep -E "^(fwd|bwd|pass) " "$out/ab_padded.log"
} 2>&1 | tee "$out/summary.log"
