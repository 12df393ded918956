#!/usr/bin/env bash
# Device call A of 2026-12-01 (seventh session): NOTES §46.
# (1) GPU tests of the L2 prefetch (bit-identical) and the long-cache decode; (2) host time a call,
# ioattn against cuDNN, and ioattn's profile; (3) launch_overhead.py (the plan's item 1); (4) the
# decode timeline at the table's 7 cases: default / l2_ahead 1, 2, 4 / cuDNN, 3 interleaved rounds.
# Usage: bash benchmarks/session_gpu_run42.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 -m pytest tests/test_gpu.py -k "l2_prefetch or decode_long_cache or decode_step_cuda_graph" \
    -n 8 -q -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 90 python3 benchmarks/host_profile.py --calls 300 > "$out/host_profile.log" 2>&1
echo "host rc=$?"; tail -n 7 "$out/host_profile.log"
timeout 90 python3 benchmarks/launch_overhead.py > "$out/launch_overhead.log" 2>&1
echo "launch rc=$?"; tail -n 6 "$out/launch_overhead.log"
timeout 240 python3 benchmarks/decode_timeline.py --out "$out/decode_ab.json" --calls 10 \
    --cases 1x4096,1x16384,1x65536,1x131072,8x8192,32x32768,64x4096 \
    --providers ioattn,ioattn+l2_ahead=1,ioattn+l2_ahead=2,ioattn+l2_ahead=4,sdpa-cudnn > "$out/decode_ab.log" 2>&1
echo "timeline rc=$?"
grep "bench timing" "$out/decode_ab.log" | sed 's/; /\n    /g'
grep -v -i warn "$out/decode_ab.log" | grep -E "span" | awk '{print $1, $2, $4, $5, $8, $9}'
