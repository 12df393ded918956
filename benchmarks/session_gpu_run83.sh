#!/usr/bin/env bash
# Thirteenth session, last call (the session's remaining device time): the d = 64 causal backward's
# policy (hopper.BWD_AUTO_MIN_SEQLEN[(64, True)] = 2048 dates from before NOTES §55's 128-row step):
# ab_bwd, d = 64 causal, N = 512 / 1024 / 2048, the portable backward, the ws kernel and cuDNN in one run.
# Usage: bash benchmarks/session_gpu_run83.sh OUT        (writes OUT/summary.log and OUT/ab_bwd64c.*)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 130 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd64c --headdims 64 --causal 1 \
    --seqlens 512,1024,2048 --providers portable,gluon-ws,sdpa-cudnn --rounds 3 > "$out/ab_bwd64c.log" 2>&1
echo "ab_bwd64c rc=$?"; tail -n 8 "$out/ab_bwd64c.log"
} 2>&1 | tee "$out/summary.log"
