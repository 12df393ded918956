#!/usr/bin/env bash
# NOTES §154: head dims the Gluon kernels do not have (80, 96, 192), zero-padded on the host to the next
# one they cover (128, 128, 256), against the default dispatch (the portable kernels there) and SDPA's
# cuDNN and FlashAttention-2 backends: ab_padded.py, forward and backward, N = 512 / 1024 / 4096 / 16384,
# both masks, 3 rounds.
# Usage: bash benchmarks/session_gpu_run223.sh OUT   (writes OUT/summary.log, OUT/ab_padded.{log,jsonl})
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 540 python3 benchmarks/ab_padded.py --out "$out" > "$out/ab_padded.log" 2>&1
echo "ab_padded rc=$? $(( $(date +%s) - t0 ))s"
grep -vE "^(fwd|bwd|pass) " "$out/ab_padded.log" | head -20
grep -E "^(fwd|bwd|pass) " "$out/ab_padded.log"
} 2>&1 | tee "$out/summary.log"
