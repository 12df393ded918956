#!/usr/bin/env bash
# Device call C of 2026-12-01 (seventh session): NOTES §46-§47.
# (1) GPU tests: the ping-pong forward with the lean softmax (IOATTN_HOPPER_LEAN=1), the launcher, decode;
# (2) host time a call, cached launch off / on (with the memoized plan), cuDNN's;
# (3) ab_fwd: ping-pong with and without the lean softmax, d=128 / 256, N=4096 / 16384, both masks,
#     3 interleaved rounds with rest (the power limiter), cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run44.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
IOATTN_HOPPER_LEAN=1 timeout 200 python3 -m pytest tests/test_gpu.py -k "hopper_forward and not exp2 and not persistent" \
    tests/test_launcher.py "tests/test_gpu.py::test_decode_long_cache" -n 8 -q -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
{ IOATTN_CACHED_LAUNCH=0 timeout 60 python3 benchmarks/host_profile.py --calls 300 --top 0 | tail -n 7
  timeout 60 python3 benchmarks/host_profile.py --calls 300 --top 30; } > "$out/host_profile.log" 2>&1
echo "host rc=$?"; head -n 7 "$out/host_profile.log"; tail -n 7 "$out/host_profile.log"
timeout 300 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_lean --headdims 128,256 --seqlens 4096,16384 \
    --causal 0,1 --loads gluon-pp,gluon-pp-lean --rounds 3 --rest 0.3 > "$out/ab_lean.log" 2>&1
echo "ab rc=$?"; tail -n 12 "$out/ab_lean.log"
