#!/usr/bin/env bash
# NOTES §134 (a diagnostic): what the backward's last wave costs. At 16k tokens the d = 128 backward has
# 2048 key blocks of 128 at every length (15.5 waves of 132 SMs); 33 heads give 4224 (32 whole waves).
# ab_bwd, the default backward and cuDNN, 3 rounds, 16 heads then 33, both masks, N = 2048 / 4096 / 16384.
# Usage: bash benchmarks/session_gpu_run180.sh OUT        (writes OUT/summary.log and OUT/run180.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run180.tar.gz" -C "$w" .; }
{
for heads in 16 33; do
    t0=$(date +%s)
    timeout 200 python3 benchmarks/ab_bwd.py --out "$w" --tag "h$heads" --headdims 128 --seqlens 2048,4096,16384 \
        --causal 0,1 --heads $heads --rounds 3 --providers gluon-ws,sdpa-cudnn > "$w/h$heads.log" 2>&1
    echo "h$heads rc=$? $(( $(date +%s) - t0 ))s"; grep -A7 "^  d c" "$w/h$heads.log"; grep -i "error\|fail" "$w/h$heads.log" | head -4
    pack
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
