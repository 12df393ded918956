#!/usr/bin/env bash
# NOTES §163: d = 64's short forward points below cuDNN (the sweep session-2026-12-21-f: causal N = 512
# 0.986x, non-causal 1024 / 2048 0.997x / 0.993x): the variants at those lengths again in one process
# (persistent, three-warpgroup, ping-pong; SDPA's backends beside), since PERSISTENT_MAX_SEQLEN's d = 64
# boundaries were measured before NOTES §121 / §129 / §132-§133 changed the persistent kernel.
# Usage: bash benchmarks/session_gpu_run245.sh OUT   (writes OUT/summary.log, OUT/ab_fwd.*)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 300 python3 benchmarks/ab_fwd.py --out "$out" --headdims 64 --seqlens 512,1024,2048,4096 --causal 0,1 \
    --loads gluon-pers,gluon-wg3,gluon-pp --rounds 5 > "$out/ab_fwd.log" 2>&1
echo "ab_fwd rc=$? $(( $(date +%s) - t0 ))s"
tail -n 20 "$out/ab_fwd.log"
} 2>&1 | tee "$out/summary.log"
