#!/usr/bin/env bash
# NOTES §139: exp2's throughput on the special-function unit in each PTX precision (fp32; f16x2, bf16x2
# packed, which ptxas 12.8 splits into two scalar MUFU.EX2.F16 / .BF16; scalar f16), read on the device's
# own build (its SASS counted beside the times).
# Usage: bash benchmarks/session_gpu_run186.sh OUT        (writes OUT/summary.log and OUT/mufu.json)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw --format=csv
timeout 240 python3 benchmarks/mufu_probe.py --json "$out/mufu.json"; echo "probe rc=$?"
timeout 120 python3 benchmarks/mufu_probe.py --json "$out/mufu2.json" | tail -n 5; echo "probe again rc=$?"
} 2>&1 | tee "$out/summary.log"
