#!/usr/bin/env bash
# NOTES §157, after run234: with the split products, the persistent kernel (the padded 256's default
# to 8192) against the one-tile ping-pong kernel at d = 160 / 192, N = 1024-16384, both masks, cuDNN in the
# same process (ab_padded.py's "gluon-pad-pers" / "gluon-pad-pp").
# Usage: bash benchmarks/session_gpu_run235.sh OUT   (writes OUT/summary.log, OUT/ab_padded.*)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 300 python3 benchmarks/ab_padded.py --out "$out" --passes fwd --headdims 160,192 \
    --seqlens 1024,2048,4096,8192,16384 --providers gluon-pad-pers,gluon-pad-pp,sdpa-cudnn > "$out/ab_padded.log" 2>&1
echo "ab_padded rc=$? $(( $(date +%s) - t0 ))s"
grep -vE "^(fwd|bwd|pass) " "$out/ab_padded.log" | head -20
grep -E "^(fwd|bwd|pass) " "$out/ab_padded.log"
} 2>&1 | tee "$out/summary.log"
