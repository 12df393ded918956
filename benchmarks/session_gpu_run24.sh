#!/usr/bin/env bash
# Device call G of 2026-12-01 (fourth session): call F's ab_fwd again with a short length first (the
# float64 check of the first length ran out of memory at 16000), and ab_varlen at d=128/256 with
# mean lengths 1024 and 4096 (the varlen policy's thresholds; NOTES §38).
# Usage: bash benchmarks/session_gpu_run24.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 benchmarks/ab_fwd.py --out "$out" --loads gluon-pp,gluon-wg3,gluon-pers --headdims 64,128 \
    --seqlens 2000,2048,16000,16384 > "$out/ab_fwd.log" 2>&1
echo "ab_fwd rc=$?"
timeout 120 python3 benchmarks/ab_varlen.py --out "$out" --headdims 128,256 --means 1024,4096 > "$out/ab_varlen.log" 2>&1
echo "ab_varlen rc=$?"
grep -E "^ *[0-9]+ [01] +[0-9]+ " "$out/ab_fwd.log" | tail -n 16
tail -n 10 "$out/ab_varlen.log"
