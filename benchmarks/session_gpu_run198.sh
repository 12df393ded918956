#!/usr/bin/env bash
# NOTES §144, after run197: (1) the narrow windows (64, 0) and (128, 0), Gluon / portable, every head dim
# (where BWD_WINDOW_MIN_WIDTH starts); (2) FlexAttention at d = 128 again, with the compiled backward's
# buffer donation off (run197's retained-graph timing hit "compiled with non-empty donated buffers").
# Usage: bash benchmarks/session_gpu_run198.sh OUT        (writes OUT/summary.log, OUT/narrow/, OUT/flex/)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)  # run197: 18 points, 2 providers + one Flex compile, 72 s
timeout 150 python3 benchmarks/ab_window.py --out "$out/narrow" --windows 64:0,128:0 --providers gluon,portable \
    > "$out/narrow.log" 2>&1
echo "narrow rc=$? $(( $(date +%s) - t0 ))s"; grep -v -i warn "$out/narrow.log" | tail -14
t0=$(date +%s)
timeout 400 python3 benchmarks/ab_window.py --out "$out/flex" --headdims 128 > "$out/flex.log" 2>&1
echo "flex rc=$? $(( $(date +%s) - t0 ))s"; grep -v -i warn "$out/flex.log" | tail -8
} 2>&1 | tee "$out/summary.log"
