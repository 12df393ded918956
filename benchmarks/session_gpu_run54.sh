#!/usr/bin/env bash
# Device call A of 2026-12-02 (ninth session): NOTES plan items 2 and 1.
# (1) session_gpu_run53.sh: the deterministic backward's GPU tests, the d=256 counters' tests and A/B;
# (2) Nsight Compute source counters of the counter build (d=128 N=16384, ours only; NOTES §50's method),
#     to find the longest segment of the consumer's step after §52.
# Usage: bash benchmarks/session_gpu_run54.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
bash benchmarks/session_gpu_run53.sh "$out"
secs="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section LaunchStats"
timeout 150 ncu --clock-control none --nvtx --nvtx-include "ioattn-d128/" --kernel-name regex:hopper_bwd $secs \
    --section SourceCounters -f -o "$out/bwd16k" python3 benchmarks/ncu_bwd.py --headdims 128 --seqlen 16384 \
    > "$out/ncu_bwd.log" 2>&1
echo "ncu ours rc=$?"
ncu -i "$out/bwd16k.ncu-rep" --page details > "$out/ncu_bwd_details.txt" 2>&1
ncu -i "$out/bwd16k.ncu-rep" --page source --csv --print-source sass > "$out/ncu_bwd_source.csv" 2>&1
echo "export rc=$? $(wc -c < "$out/ncu_bwd_source.csv") bytes"; gzip -f "$out/ncu_bwd_source.csv"; rm -f "$out/bwd16k.ncu-rep"
grep -E "Duration|Tensor|L1/TEX Hit|Warp Cycles Per Issued|Issued Warp" "$out/ncu_bwd_details.txt" | cut -c1-120 | head -n 12
