#!/usr/bin/env bash
# NOTES §143: the varlen backward, Gluon (ws, IS_VARLEN) / portable / torch's nested-jagged SDPA, on
# ragged batches of ~16k tokens (ab_varlen.py --pass bwd), every head dim, means 512 to 4096.
# Usage: bash benchmarks/session_gpu_run194.sh OUT        (writes OUT/summary.log, OUT/ab_varlen_bwd.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 420 python3 benchmarks/ab_varlen.py --pass bwd --out "$out" --headdims 64,128,256 \
    --means 512,1024,2048,4096 > "$out/ab_varlen_bwd.log" 2>&1
echo "ab_varlen bwd rc=$? $(( $(date +%s) - t0 ))s"
cat "$out/ab_varlen_bwd.log" | grep -v Warning | tail -30
} 2>&1 | tee "$out/summary.log"
