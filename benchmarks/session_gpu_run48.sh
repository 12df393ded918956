#!/usr/bin/env bash
# Device call A of 2026-12-01 (eighth session): NOTES §50.
# (1) GPU tests of decode (its torch.compile test first ran on the CPU only), merge, launcher;
# (2) compute-sanitizer memcheck on the forward with the lean softmax and the backward (d=128, 256);
# (3) decode: the L2 eviction policy of the K/V loads, 3 interleaved rounds, cuDNN in the same run
#     (the case set and the plan field were removed after this run: no effect, NOTES §50);
# (4) Nsight Compute on the backward, d=128 N=16384: ours (every kernel of the call) against cuDNN's.
# Usage: bash benchmarks/session_gpu_run48.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 -m pytest tests/test_decode.py tests/test_merge.py tests/test_launcher.py -n 8 -q -p no:cacheprovider \
    -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
grep -E "torch_compile" "$out/test_gpu.log" | head -n 4
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 benchmarks/sanitize_small.py --heads 128,256 \
    > "$out/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -n 2 "$out/memcheck.log"
timeout 120 python3 benchmarks/ab_decode.py --out "$out" --cases evict --rounds 3 > "$out/ab_decode_evict.log" 2>&1
echo "evict rc=$?"; sed -n '/median over rounds/,$p' "$out/ab_decode_evict.log"
timeout 200 ncu --clock-control none --nvtx --nvtx-include "ioattn-d128/" --nvtx-include "cudnn-d128/" \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    --section InstructionStats --section Occupancy --section LaunchStats \
    --metrics "regex:sm__pipe_tensor.*cycles_active.avg.pct_of_peak_sustained_active,regex:sm__inst_executed_pipe_(alu|fma|fmaheavy|xu|lsu|uniform|tensor.*).sum$" \
    python3 benchmarks/ncu_bwd.py --headdims 128 --seqlen 16384 --cudnn > "$out/ncu_bwd.txt" 2>&1
echo "ncu rc=$?"
grep -E "^  [a-zA-Z_].*\(|Duration|Registers Per|Warp Cycles Per Issued|Issued Warp Per Scheduler|No Eligible|Eligible Warps|Executed Ipc A|sm__pipe_tensor|inst_executed_pipe|Executed Instructions  " \
    "$out/ncu_bwd.txt" | cut -c1-110 | head -n 60
