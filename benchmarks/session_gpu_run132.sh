#!/usr/bin/env bash
# NOTES §107: the backward with dK issued before dS^T's store and exchange (WS_DK_EARLY, ab_bwd
# "gluon-ws-dkearly"): (1) its GPU tests (the backward suite's shapes, both forwards, masks and dtypes);
# 6 workers; (2) ab_bwd against the default and cuDNN, d = 128 / 64, 3 rounds.
# Usage: bash benchmarks/session_gpu_run132.sh OUT        (writes OUT/summary.log and OUT/run132.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run132.tar.gz" -C "$w" .; }
{
timeout 150 python3 -m pytest -q -n 6 tests/test_gpu.py -p no:cacheprovider -k "(test_hopper_backward and ws-dkearly)" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
timeout 260 python3 benchmarks/ab_bwd.py --out "$w" --tag dkearly --headdims 128,64 --seqlens 1024,4096,16384 \
    --providers gluon-ws,gluon-ws-dkearly,sdpa-cudnn --rounds 3 > "$w/dkearly.log" 2>&1
echo "ab rc=$?"; grep -E "Error|error|FAIL" "$w/dkearly.log" | head -4; grep -A14 "^  d c" "$w/dkearly.log"; pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
