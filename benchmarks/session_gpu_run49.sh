#!/usr/bin/env bash
# Device call B of 2026-12-01 (eighth session): NOTES §50, the backward's stalls by instruction.
# (1) Nsight Compute with source counters on the ws backward kernel, d=128 N=16384 (report exported as
#     details + per-SASS-instruction CSV);
# (2) cuDNN's forward and backward at the same shape, every kernel profiled (its backward runs on
#     autograd's thread, outside an NVTX range), the same sections.
# Usage: bash benchmarks/session_gpu_run49.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
secs="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section LaunchStats"
timeout 200 ncu --clock-control none --nvtx --nvtx-include "ioattn-d128/" --kernel-name regex:hopper_bwd $secs \
    --section SourceCounters -f -o "$out/bwd16k" python3 benchmarks/ncu_bwd.py --headdims 128 --seqlen 16384 \
    > "$out/ncu_bwd.log" 2>&1
echo "ncu ours rc=$?"
ncu -i "$out/bwd16k.ncu-rep" --page details > "$out/ncu_bwd_details.txt" 2>&1
ncu -i "$out/bwd16k.ncu-rep" --page source --csv --print-source sass > "$out/ncu_bwd_source.csv" 2>&1
echo "export rc=$? $(wc -c < "$out/ncu_bwd_source.csv") bytes"; gzip -f "$out/ncu_bwd_source.csv"; rm -f "$out/bwd16k.ncu-rep"
timeout 200 ncu --clock-control none $secs --section Occupancy \
    python3 benchmarks/ncu_bwd.py --headdims 128 --seqlen 16384 --cudnn-only > "$out/ncu_cudnn.txt" 2>&1
echo "ncu cudnn rc=$?"
grep -E "warp stall|Stall|stall" "$out/ncu_bwd_details.txt" | cut -c1-140 | head -n 20
awk '/^  [a-zA-Z_].*\(/{name=substr($0,1,100)} /Duration/{print $3, $2, name}' "$out/ncu_cudnn.txt"
grep -E "^  [a-zA-Z_].*\(|Duration|Registers Per|Block Size|Grid Size|Warp Cycles Per Issued|Issued Warp Per Scheduler|Executed Ipc A|Issue Slots|Executed Instructions  |Tensor is|SM Busy|Dynamic Shared" \
    "$out/ncu_cudnn.txt" | grep -v elementwise | cut -c1-120 | tail -n 30
