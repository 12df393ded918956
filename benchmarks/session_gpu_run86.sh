#!/usr/bin/env bash
# Third device call of the fourteenth session (2026-12-02), NOTES §78: decode launches without splits.
# (1) the device timeline and the bench's timing at 64 / 66 x 4096 for the default, 64-key chunks with
# 2 stages, the step kernel without programmatic dependent launch, and cuDNN (kernel durations, the
# call period back to back, the event-bracketed time); (2) ab_decode --cases wide64: 64-key chunks
# against the default at every no-split batch size measured (60-128 x 4096, 32 x 32768).
# Usage: bash benchmarks/session_gpu_run86.sh OUT        (writes OUT/summary.log and OUT/run86.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 200 python3 benchmarks/decode_timeline.py --out "$w/timeline.json" --cases 64x4096,66x4096 \
    --providers ioattn,ioattn+block_n=64+num_stages=2,ioattn+pdl_wait=0,sdpa-cudnn --calls 10 --rounds 5 \
    > "$w/timeline.log" 2>&1
echo "timeline rc=$?"; grep -v Warn "$w/timeline.log" | grep -v _warn_once | cut -c1-150
timeout 250 python3 benchmarks/ab_decode.py --out "$w" --cases wide64 --rounds 3 > "$w/wide64.log" 2>&1
echo "wide64 rc=$?"; sed -n '/median over rounds/,$p' "$w/wide64.log"
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run86.tar.gz" -C "$w" . && rm -rf "$w"
