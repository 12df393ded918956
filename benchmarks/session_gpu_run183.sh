#!/usr/bin/env bash
# NOTES §136: the d = 128 backward with its Q / dO rings three deep (hopper_backward.WS_STAGES), against
# the default (two deep): ab_bwd d = 128, default / three deep / cuDNN, 3 rounds, N = 1024 / 4096 / 16384,
# both masks, in two processes with the two builds in opposite order (the gradients of each build
# checked against the float64 oracle at N = 1024 before timing).
# Usage: bash benchmarks/session_gpu_run183.sh OUT        (writes OUT/summary.log and OUT/run183.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run183.tar.gz" -C "$w" .; }
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
for order in A B; do
    if [ $order = A ]; then prov=gluon-ws,gluon-ws-st3,sdpa-cudnn; else prov=gluon-ws-st3,gluon-ws,sdpa-cudnn; fi
    t0=$(date +%s)
    timeout 170 python3 benchmarks/ab_bwd.py --out "$w" --tag "ab$order" --headdims 128 --seqlens 1024,4096,16384 \
        --causal 0,1 --rounds 3 --providers $prov > "$w/ab$order.log" 2>&1
    echo "ab$order rc=$? $(( $(date +%s) - t0 ))s"; grep -A7 "^  d c" "$w/ab$order.log"; grep -i "error\|fail" "$w/ab$order.log" | head -4
    pack
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
