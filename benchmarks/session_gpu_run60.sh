#!/usr/bin/env bash
# Device call for the next session (written 2026-12-02, ninth session; NOTES plan item 2): the d=256
# (column-split) backward under Nsight Compute, as NOTES §54 profiled d=128: source counters of ours at
# N=4096 (where it is furthest behind cuDNN, 0.84x), exported as details + per-SASS-instruction CSV, and
# cuDNN's forward and backward at the same shape, every kernel profiled, the same sections.
# Usage: bash benchmarks/session_gpu_run60.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
secs="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section LaunchStats"
timeout 170 ncu --clock-control none --nvtx --nvtx-include "ioattn-d256/" --kernel-name regex:hopper_bwd $secs \
    --section SourceCounters -f -o "$out/bwd256" python3 benchmarks/ncu_bwd.py --headdims 256 --seqlen 4096 \
    > "$out/ncu_bwd256.log" 2>&1
echo "ncu ours rc=$?"
ncu -i "$out/bwd256.ncu-rep" --page details > "$out/ncu_bwd256_details.txt" 2>&1
ncu -i "$out/bwd256.ncu-rep" --page source --csv --print-source sass > "$out/ncu_bwd256_source.csv" 2>&1
echo "export rc=$? $(wc -c < "$out/ncu_bwd256_source.csv") bytes"; gzip -f "$out/ncu_bwd256_source.csv"
rm -f "$out/bwd256.ncu-rep"
timeout 90 ncu --clock-control none $secs --section Occupancy \
    python3 benchmarks/ncu_bwd.py --headdims 256 --seqlen 4096 --cudnn-only > "$out/ncu_cudnn256.txt" 2>&1
echo "ncu cudnn rc=$?"
grep -E "Duration|Tensor|L1/TEX Cache|L2 Cache Throughput|Warp Cycles Per Issued" "$out/ncu_bwd256_details.txt" | cut -c1-120
awk '/^  [a-zA-Z_].*\(/{name=substr($0,1,100)} /Duration/{print $3, $2, name}' "$out/ncu_cudnn256.txt"
