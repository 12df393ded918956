#!/usr/bin/env bash
# Last device call of the seventeenth session (2026-12-02), on the machine still warm from run105: the
# train sweep at d = 64 alone with the session's defaults (a second sample of issue 5's d = 64 figure,
# beside run103's all-head-dim sweep), cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run106.sh OUT        (writes OUT/run106.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 200 python3 -m ioattn bench train --headdims 64 --providers ioattn,sdpa-cudnn --out "$w/train64" \
    > "$w/train64.log" 2>&1
echo "train rc=$?"; rm -f "$w"/train64/*.png
sed -n '/== train sweep/,$p' "$w/train64.log" | grep " fwd \| bwd " | head -n 30
tar -czf "$out/run106.tar.gz" -C "$w" .
