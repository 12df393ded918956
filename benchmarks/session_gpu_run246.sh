#!/usr/bin/env bash
# NOTES §163, second run: d = 64's short forward variants through the launcher with only the variant
# forced (ab_padded's "gluon-pad-pers" / "-wg3" / "-pp"), the API's dispatch ("ioattn") and cuDNN beside.
# Usage: bash benchmarks/session_gpu_run246.sh OUT   (writes OUT/summary.log, OUT/ab_padded.*)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 300 python3 benchmarks/ab_padded.py --out "$out" --passes fwd --headdims 64 --rounds 5 \
    --seqlens 512,1024,2048,4096 --providers ioattn,gluon-pad-pers,gluon-pad-wg3,gluon-pad-pp,sdpa-cudnn \
    > "$out/ab_padded.log" 2>&1
echo "ab_padded rc=$? $(( $(date +%s) - t0 ))s"
grep -vE "^(fwd|bwd|pass) " "$out/ab_padded.log" | head -10
grep -E "^(fwd|bwd|pass) " "$out/ab_padded.log"
} 2>&1 | tee "$out/summary.log"
