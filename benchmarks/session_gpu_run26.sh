#!/usr/bin/env bash
# Device call A of 2026-12-01 (fifth session): diagnostics before any change (NOTES §40).
# (1) decode: batches 60-68 x 4096 (does batch 64's step time follow the wave count?) and the paged
#     batch 1 x 4096 candidates (pointer loads / TMA x 16 / 32 splits, eager and graph replay);
# (2) Nsight Compute on the persistent and the one-tile ping-pong forward at d=128, N=16384
#     non-causal (warp stall reasons, per-instruction samples);
# (3) `ioattn bench train` at d=128 N=16384 (the causal forward point to re-measure).
# Usage: bash benchmarks/session_gpu_run26.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 benchmarks/ab_decode.py --out "$out" --cases waves --rounds 2 > "$out/ab_decode_waves.log" 2>&1
echo "waves rc=$?"
timeout 100 python3 benchmarks/ab_decode.py --out "$out" --cases paged1 --rounds 3 > "$out/ab_decode_paged1.log" 2>&1
echo "paged1 rc=$?"
timeout 200 ncu --clock-control none --kernel-name regex:hopper_fwd --launch-skip 4 --launch-count 2 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section SourceCounters --section LaunchStats -f -o "$out/fwd16k" \
    python3 benchmarks/ncu_fwd.py --variants persistent,pingpong --seqlen 16384 --headdim 128 > "$out/ncu_fwd.log" 2>&1
echo "ncu rc=$?"
ncu -i "$out/fwd16k.ncu-rep" --page details > "$out/ncu_fwd_details.txt" 2>&1
ncu -i "$out/fwd16k.ncu-rep" --page source --csv --print-source sass > "$out/ncu_fwd_source.csv" 2>&1
echo "ncu export rc=$? $(wc -c < "$out/ncu_fwd_source.csv") bytes"
mkdir -p "$out/train"
timeout 150 python3 -m ioattn bench train --headdims 128 --seqlens 16384 --providers ioattn,sdpa-cudnn \
    --out "$out/train" > "$out/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
grep -A40 "median over rounds" "$out/ab_decode_waves.log"
grep -A20 "median over rounds" "$out/ab_decode_paged1.log"
grep -E "Duration|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall" "$out/ncu_fwd_details.txt" | head -n 30
grep -v "^wrote" "$out/train.log" | tail -n 14
