#!/usr/bin/env bash
# Device call A of the next session (written, not yet run): NOTES plan items 1 and 2.
# (1) benchmarks/launch_overhead.py: is the bench's extra 1.3 us a call at decode 64 x 4096 the launch of
# a Triton kernel with ~60 arguments? (2) Nsight Compute warp-state and scheduler sections of the d=128
# N=16384 forward, ours (ping-pong) against cuDNN's persistent kernel: where the 6.6 % more active
# cycles go (NOTES §43). (3) the decode timeline at 64 x 4096 with 40 calls.
# Usage: bash benchmarks/session_gpu_run41.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 120 python3 benchmarks/launch_overhead.py > "$out/launch_overhead.log" 2>&1
echo "launch rc=$?"
timeout 200 ncu --clock-control none --kernel-name regex:"hopper_fwd|sdpa|fprop|fmha" --launch-skip 4 --launch-count 2 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    python3 benchmarks/ncu_fwd.py --variants pingpong --cudnn --seqlen 16384 --headdim 128 > "$out/ncu_fwd_stalls.txt" 2>&1
echo "ncu rc=$?"
timeout 120 python3 benchmarks/decode_timeline.py --out "$out/decode_64x4096.json" --cases 64x4096 --calls 40 \
    --providers ioattn,ioattn+pdl_wait=0,ioattn-graph,sdpa-cudnn > "$out/decode_64x4096.log" 2>&1
echo "timeline rc=$?"
cat "$out/launch_overhead.log" | tail -n 8
grep -E "^  [a-zA-Z_].*\(|Duration|Warp Cycles Per Issued|Issued Warp Per Scheduler|No Eligible|Active Warps Per|Eligible Warps|Stall" \
    "$out/ncu_fwd_stalls.txt" | cut -c1-120 | head -n 40
grep -v -i warn "$out/decode_64x4096.log" | grep -E "span|bench timing" | sed 's/; /\n    /g'
