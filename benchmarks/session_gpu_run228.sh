#!/usr/bin/env bash
# NOTES §155, the A/B: ab_padded.py with the launchers' path ("gluon-pad": in place at d = 80 / 96 /
# 192), §154's copies ("gluon-fpad"), the default dispatch, the portable kernels and cuDNN, N = 512 to
# 16384, both masks, forward and backward, 3 rounds.
# Usage: bash benchmarks/session_gpu_run228.sh OUT   (writes OUT/summary.log, OUT/ab_padded.{log,jsonl})
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 420 python3 benchmarks/ab_padded.py --out "$out" --seqlens 512,1024,2048,4096,8192,16384 \
    --providers ioattn,portable,gluon-pad,gluon-fpad,sdpa-cudnn > "$out/ab_padded.log" 2>&1
echo "ab_padded rc=$? $(( $(date +%s) - t0 ))s"
grep -vE "^(fwd|bwd|pass) " "$out/ab_padded.log" | head -20
grep -E "^(fwd|bwd|pass) " "$out/ab_padded.log"
} 2>&1 | tee "$out/summary.log"
