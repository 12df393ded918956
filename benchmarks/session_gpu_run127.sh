#!/usr/bin/env bash
# NOTES §105: the backward with each consumer warpgroup a partition of its own (WS_WG_PARTITIONS, ab_bwd
# "gluon-ws-wgsplit"): (1) its GPU tests (the backward suite's shapes, both forwards, masks and dtypes;
# the ordered dQ mode; 6 workers); (2) ab_bwd against the default and cuDNN, d = 128 / 64, 3 rounds.
# Usage: bash benchmarks/session_gpu_run127.sh OUT        (writes OUT/summary.log and OUT/run127.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run127.tar.gz" -C "$w" .; }
{
timeout 150 python3 -m pytest -q -n 6 tests/test_gpu.py -p no:cacheprovider -k "(test_hopper_backward and ws-wgsplit) or (test_hopper_backward_deterministic and True-True)" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
timeout 260 python3 benchmarks/ab_bwd.py --out "$w" --tag wgsplit --headdims 128,64 --seqlens 1024,4096,16384 \
    --providers gluon-ws,gluon-ws-wgsplit,sdpa-cudnn --rounds 3 > "$w/wgsplit.log" 2>&1
echo "ab rc=$?"; grep -E "Error|error|FAIL" "$w/wgsplit.log" | head -4; grep -A14 "^  d c" "$w/wgsplit.log"; pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
