#!/usr/bin/env bash
# Device call for the next session (written 2026-12-02, tenth session; NOTES §62): fewer masked key
# tiles in the two-warpgroup ping-pong kernels (hopper.fewer_masks, off until measured).
# (1) GPU tests: test_hopper_forward_fewer_masks (ping-pong, split, persistent; every head dim, both
#     masks; one key tile, ragged ends, rows with no visible key), -v;
# (2) ab_fwd, 2 interleaved rounds with rest, cuDNN in the same run: ping-pong and persistent with and
#     without it at d = 128 (both masks), the portable kernel beside them.
# Usage: bash benchmarks/session_gpu_run66.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 180 python3 -m pytest tests/test_gpu.py -k "fewer_masks" -n 16 -v -p no:cacheprovider -rfE \
    > "$out/test_gpu_fm.log" 2>&1
echo "tests rc=$?"; grep -c " PASSED " "$out/test_gpu_fm.log"; tail -n 1 "$out/test_gpu_fm.log"
grep -E " FAILED | ERROR " "$out/test_gpu_fm.log" | head -n 5
timeout 200 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_fm128 --headdims 128 --seqlens 512,1024,2048,16384 \
    --loads tma,gluon-pp-lean,gluon-pp-lean-fm,gluon-pers-lean,gluon-pers-lean-fm --rounds 2 --rest 0.1 \
    > "$out/ab_fm128.log" 2>&1
echo "ab rc=$?"; tail -n 10 "$out/ab_fm128.log"
