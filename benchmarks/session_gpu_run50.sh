#!/usr/bin/env bash
# Device call C of 2026-12-01 (eighth session): NOTES §50, the ws backward's step order.
# (1) GPU tests of the backward (STATS_EARLY on by default now);
# (2) ab_bwd: the ws kernel with lse / D read early or late and the dQ hand-off in its step or the
#     next, cuDNN in the same run, 3 interleaved rounds (each provider's gradients checked against the
#     float64 oracle at N=1024 first); d=64 old / new default only. (Both options were removed after this
#     run, NOTES §50: the providers "gluon-ws+..." no longer exist.)
# Usage: bash benchmarks/session_gpu_run50.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 200 python3 -m pytest tests/test_gpu.py -k "backward" -n 8 -q -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 330 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_d128 --headdims 128 --seqlens 1024,4096,16384 \
    --rounds 3 --providers "gluon-ws+STATS_EARLY=0,DQ_LATE=0;gluon-ws;gluon-ws+STATS_EARLY=1,DQ_LATE=1;gluon-ws+STATS_EARLY=0,DQ_LATE=1;sdpa-cudnn" \
    > "$out/ab_bwd_d128.log" 2>&1
echo "ab d128 rc=$?"; grep -A12 "^  d c" "$out/ab_bwd_d128.log"
timeout 150 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_d64 --headdims 64 --seqlens 1024,16384 \
    --rounds 3 --providers "gluon-ws+STATS_EARLY=0,DQ_LATE=0;gluon-ws;sdpa-cudnn" > "$out/ab_bwd_d64.log" 2>&1
echo "ab d64 rc=$?"; grep -A6 "^  d c" "$out/ab_bwd_d64.log"
