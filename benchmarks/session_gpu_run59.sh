#!/usr/bin/env bash
# Device call for the next session (written 2026-12-02, ninth session; NOTES §57): the forward's output
# stored as whole rows (hopper.out_row_stores, the kernel's ROW_STORES), off until measured.
# (1) GPU tests: test_hopper_forward_row_stores (every variant, d = 64 / 128, both masks);
# (2) ab_fwd, 2 interleaved rounds with rest, cuDNN in the same run: the portable kernel (tma), each
#     Gluon variant as dispatched (lean softmax) with and without -rows, N = 512 ... 16384.
# (3) below: NOTES §58.
# Usage: bash benchmarks/session_gpu_run59.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 100 python3 -m pytest tests/test_gpu.py -k "row_stores" -n 8 -q -p no:cacheprovider -rfE \
    > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 150 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_rows128 --headdims 128 --seqlens 512,1024,2048,16384 \
    --loads tma,gluon-pp-lean,gluon-pp-lean-rows,gluon-pers-lean,gluon-pers-lean-rows --rounds 2 --rest 0.1 \
    > "$out/ab_rows128.log" 2>&1
echo "ab d128 rc=$?"; tail -n 10 "$out/ab_rows128.log"
timeout 150 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_rows64 --headdims 64 --seqlens 512,1024,2048,16384 \
    --loads tma,gluon-wg3,gluon-wg3-rows,gluon-pers-lean,gluon-pers-lean-rows --rounds 2 --rest 0.1 \
    > "$out/ab_rows64.log" 2>&1
echo "ab d64 rc=$?"; tail -n 10 "$out/ab_rows64.log"
# (3) NOTES §58: d = 256's dK / dV staged through the Q ring as whole rows (WS_D256_ROW_STORES): its GPU
#     tests (Gluon forward feeding) and the A/B against the accumulator-layout stores.
timeout 60 python3 -m pytest tests/test_gpu.py -k "ws-rows256 and gluon" -n 8 -q -p no:cacheprovider -rfE \
    > "$out/test_gpu_rows256.log" 2>&1
echo "tests rows256 rc=$?"; tail -n 1 "$out/test_gpu_rows256.log"
timeout 90 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_rows256 --headdims 256 --seqlens 1024,4096,16384 \
    --rounds 3 --providers gluon-ws,gluon-ws-rows256,sdpa-cudnn > "$out/ab_bwd_rows256.log" 2>&1
echo "ab rows256 rc=$?"; grep -A7 "^  d c" "$out/ab_bwd_rows256.log"
