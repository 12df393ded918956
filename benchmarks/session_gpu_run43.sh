#!/usr/bin/env bash
# Device call B of 2026-12-01 (seventh session): NOTES §46-§47.
# (1) GPU tests: cached launches (decode, merge, launcher), the L2 line prefetch (bit-identical);
# (2) host time a call with and without the cached launch (IOATTN_CACHED_LAUNCH=0), cuDNN's;
# (3) decode timeline: L2 line prefetch 2 / 4 chunks ahead against the default and cuDNN;
# (4) Nsight Compute warp-state / scheduler sections, forward d=128 N=16384, ping-pong vs cuDNN (issue 5).
# Usage: bash benchmarks/session_gpu_run43.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 170 python3 -m pytest tests/test_launcher.py tests/test_merge.py tests/test_decode.py \
    "tests/test_gpu.py::test_decode_l2_prefetch" "tests/test_gpu.py::test_decode_step_cuda_graph" \
    "tests/test_gpu.py::test_decode_long_cache" -n 8 -q -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
{ IOATTN_CACHED_LAUNCH=0 timeout 60 python3 benchmarks/host_profile.py --calls 300 --top 0 | tail -n 7
  timeout 60 python3 benchmarks/host_profile.py --calls 300 --top 30; } > "$out/host_profile.log" 2>&1
echo "host rc=$?"; head -n 7 "$out/host_profile.log"; tail -n 7 "$out/host_profile.log"
timeout 150 python3 benchmarks/decode_timeline.py --out "$out/decode_ab.json" --calls 10 \
    --cases 1x16384,1x131072,8x8192,64x4096 \
    --providers ioattn,ioattn+l2_ahead=2,ioattn+l2_ahead=4,sdpa-cudnn > "$out/decode_ab.log" 2>&1
echo "timeline rc=$?"
grep "bench timing" "$out/decode_ab.log" | sed 's/; /\n    /g'
timeout 200 ncu --clock-control none --kernel-name regex:"hopper_fwd|sdpa|fprop|fmha" --launch-skip 4 --launch-count 2 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    python3 benchmarks/ncu_fwd.py --variants pingpong --cudnn --seqlen 16384 --headdim 128 > "$out/ncu_fwd_stalls.txt" 2>&1
echo "ncu rc=$?"
grep -E "^  [a-zA-Z_].*\(|Duration|Warp Cycles Per Issued|Issued Warp Per Scheduler|No Eligible|Active Warps Per|Eligible Warps|Stall" \
    "$out/ncu_fwd_stalls.txt" | cut -c1-120 | head -n 40
