#!/usr/bin/env bash
# NOTES §161, the forward's split ring at the products over 192 columns (hopper.split_ring): (1)
# ab_padded's forward at d = 192 / 160, the ring ("gluon-pad-ring") against the whole tiles ("gluon-pad"),
# cuDNN in the same process; (2) the GPU tests of the ring (bitwise against the whole tiles, the oracle)
# and the padded forward's.
# Usage: bash benchmarks/session_gpu_run242.sh OUT   (writes OUT/summary.log, OUT/ab_padded.*, OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 240 python3 benchmarks/ab_padded.py --out "$out" --passes fwd --headdims 192,160 --rounds 3 \
    --seqlens 512,1024,2048,4096,16384 --providers gluon-pad,gluon-pad-ring,sdpa-cudnn > "$out/ab_padded.log" 2>&1
echo "ab_padded rc=$? $(( $(date +%s) - t0 ))s"
grep -vE "^(fwd|bwd|pass) " "$out/ab_padded.log" | head -10
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "split_ring or test_hopper_split_cols or (test_hopper_padded_head_dims and 192)" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
grep -E "^(fwd|bwd|pass) " "$out/ab_padded.log"
} 2>&1 | tee "$out/summary.log"
