#!/usr/bin/env bash
# Second device call of the fourteenth session (2026-12-02): decode batch 64 x 4096, where cuDNN streams
# a full wave ~1 % faster than our split kernel (NOTES §76, §77). (1) the device timeline of both
# providers' steps (kernel names, durations) at 64 and 66 x 4096; (2) Nsight Compute on one step of
# each at 64 x 4096 (launch, occupancy, memory sections); (3) ab_decode --cases resident: several
# programs resident per SM (smaller rings, registers capped) against the one-per-SM default.
# Usage: bash benchmarks/session_gpu_run85.sh OUT        (writes OUT/summary.log and OUT/run85.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 100 python3 benchmarks/decode_timeline.py --out "$w/timeline.json" --cases 64x4096,66x4096 \
    --providers ioattn,sdpa-cudnn --calls 10 --rounds 1 > "$w/timeline.log" 2>&1
echo "timeline rc=$?"; tail -n 25 "$w/timeline.log" | cut -c1-160
secs="--section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats"
timeout 150 ncu --clock-control none --nvtx --nvtx-include "prof/" $secs -f -o "$w/dec64" \
    python3 benchmarks/ncu_decode.py --batch 64 --kvlen 4096 > "$w/ncu_decode.log" 2>&1
echo "ncu rc=$?"; tail -n 3 "$w/ncu_decode.log"
ncu -i "$w/dec64.ncu-rep" --page details > "$w/ncu_decode_details.txt" 2>&1; rm -f "$w/dec64.ncu-rep"
grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Through|Memory Through|L2 Hit|Grid Size|Block Size|Registers Per|Shared Memory Config|Dynamic Shared|Achieved Occupancy|Theoretical Occupancy|Waves Per SM|Block Limit|Issued Warp|No Eligible|Warp Cycles Per Issued" \
    "$w/ncu_decode_details.txt" | cut -c1-120
timeout 150 python3 benchmarks/ab_decode.py --out "$w" --cases resident --rounds 3 > "$w/resident.log" 2>&1
echo "resident rc=$?"; sed -n '/median over rounds/,$p' "$w/resident.log"
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run85.tar.gz" -C "$w" . && rm -rf "$w"
