#!/usr/bin/env bash
# Device call D of 2026-12-01 (sixth session): NOTES §44, the decode merge released after the split
# programs' key loop (PDL_LATE). (1) the long-cache decode GPU tests (oracle, bit-identical to the plain
# launch, early and late release); (2) decode_timeline.py: ioattn / ioattn-pdl-late / cuDNN kernels,
# gaps and the bench's timing in 3 interleaved rounds at batch 1 x 4k / 16k / 64k / 128k and 8 x 8192;
# (3) Nsight Compute launch statistics of both libraries' decode kernels at batch 1 x 16k.
# (The early release and its pdl_late field were removed after run 37: the late release is the
# kernel's only form now, NOTES §44.)
# Usage: bash benchmarks/session_gpu_run36.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 200 python3 -m pytest tests/test_gpu.py -k "decode_long_cache or decode_step_cuda_graph" -n 8 -q \
    -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 200 python3 benchmarks/decode_timeline.py --out "$out/decode_timeline_late.json" \
    --cases 1x4096,1x16384,1x65536,1x131072,8x8192 --providers ioattn,ioattn-pdl-late,sdpa-cudnn \
    > "$out/decode_timeline_late.log" 2>&1
echo "timeline rc=$?"
timeout 120 ncu --clock-control none --kernel-name regex:"decode_split|merge_states|sdpa|lean_reduction" \
    --launch-count 12 --section LaunchStats --section Occupancy --section SpeedOfLight \
    python3 benchmarks/decode_timeline.py --out "$out/ncu_dummy.json" --cases 1x16384 --calls 2 --rounds 0 \
    --providers ioattn,sdpa-cudnn > "$out/ncu_decode.txt" 2>&1
echo "ncu rc=$?"; rm -f "$out/ncu_dummy.json"
grep -v -i "warn" "$out/decode_timeline_late.log" | grep -E "span|bench timing|decode_split|cudnn_generated"
grep -E "^  [a-z_A-Z].*\(|Grid Size|Block Size|Registers Per|Shared Memory Configuration Size|Dynamic Shared|Static Shared|Waves Per SM|Achieved Occupancy|Theoretical Occupancy|Duration|DRAM Throughput" \
    "$out/ncu_decode.txt" | cut -c1-120 | tail -n 45
