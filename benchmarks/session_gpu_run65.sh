#!/usr/bin/env bash
# Device call for the next session (written 2026-12-02, tenth session; NOTES §61): d = 256's forward
# output staged in each consumer warpgroup's Q buffer and stored as whole rows
# (hopper.out_row_stores_via_q, off until measured).
# (1) GPU tests: test_hopper_forward_row_stores_via_q (ping-pong and split, both masks and dtypes), -v;
# (2) ab_fwd, 2 interleaved rounds with rest, cuDNN in the same run: the ping-pong kernel (the d = 256
#     default beyond the persistent variant's lengths, and for causal calls) with and without it.
# Usage: bash benchmarks/session_gpu_run65.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 -m pytest tests/test_gpu.py -k "row_stores_via_q" -n 16 -v -p no:cacheprovider -rfE \
    > "$out/test_gpu_viaq.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu_viaq.log"; grep -E " FAILED | ERROR " "$out/test_gpu_viaq.log" | head -n 5
timeout 200 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_viaq256 --headdims 256 --seqlens 512,1024,2048,16384 \
    --loads tma,gluon-pp-lean,gluon-pp-lean-viaq --rounds 2 --rest 0.1 > "$out/ab_viaq256.log" 2>&1
echo "ab rc=$?"; tail -n 10 "$out/ab_viaq256.log"
