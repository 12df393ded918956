#!/usr/bin/env bash
# NOTES §100: lse folded into S^T's accumulator (WS_LSE_IN_ACC, ab_bwd "gluon-ws-lse"): (1) its GPU tests
# (the backward suite's shapes, both forwards, masks and dtypes; 6 workers: the largest shape's float64
# oracle ran out of memory at 14 in run119); (2) ab_bwd against the default (flat dQ) and cuDNN,
# d = 128 / 64, 3 rounds.
# Usage: bash benchmarks/session_gpu_run121.sh OUT        (writes OUT/summary.log and OUT/run121.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run121.tar.gz" -C "$w" .; }
{
timeout 150 python3 -m pytest -q -n 6 tests/test_gpu.py -p no:cacheprovider -k "test_hopper_backward and ws-lse" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
timeout 200 python3 benchmarks/ab_bwd.py --out "$w" --tag lse --headdims 128,64 --seqlens 1024,4096,16384 \
    --providers gluon-ws,gluon-ws-lse,sdpa-cudnn --rounds 3 > "$w/lse.log" 2>&1
echo "ab rc=$?"; grep -E "Error|error|FAIL" "$w/lse.log" | head -4; grep -A14 "^  d c" "$w/lse.log"; pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
