#!/usr/bin/env bash
# NOTES §129's decision (the partition-barrier pass in the ping-pong and persistent kernels, not wg3):
# (1) wg3 d = 64 causal N = 16384 again, with / without, in a new process (run169: 495 / 509); (2) the
# train sweep at head dims 64, 128, 256 as the library runs now (the README's table), cuDNN in the same
# run.
# Usage: bash benchmarks/session_gpu_run170.sh OUT        (writes OUT/summary.log and OUT/run170.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run170.tar.gz" -C "$w" .; }
{
t0=$(date +%s)
timeout 70 python3 benchmarks/ab_fwd.py --out "$w" --tag wg3c2 --headdims 64 --causal 1 --seqlens 2048,16384 \
    --loads gluon-wg3-crw-pb,gluon-wg3-crw-nopb --rounds 3 --rest 0.2 > "$w/wg3c2.log" 2>&1
echo "wg3c2 rc=$? $(( $(date +%s) - t0 ))s"; grep -A4 "^  d c" "$w/wg3c2.log"
pack
t0=$(date +%s)
timeout 420 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$? $(( $(date +%s) - t0 ))s"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " (fwd|bwd) " | head -n 80
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
