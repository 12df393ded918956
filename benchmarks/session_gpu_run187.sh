#!/usr/bin/env bash
# NOTES §140: the train sweep again with unchanged kernels (a sample of the sweep-to-sweep spread at the
# issue's points): head dims 64, 128, 256, cuDNN in the same run (the README's table command).
# Usage: bash benchmarks/session_gpu_run187.sh OUT        (writes OUT/summary.log and OUT/run187.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run187.tar.gz" -C "$w" .; }
{
t0=$(date +%s)  # 148-169 s in runs 175-180
timeout 260 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$? $(( $(date +%s) - t0 ))s"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " (fwd|bwd) " | head -n 80
pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
