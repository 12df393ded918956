#!/usr/bin/env bash
# NOTES §106: the backward's query-block walk started at a different block by each key block (WS_STAGGER,
# ab_bwd "gluon-ws-stagger"): (1) its GPU tests (the backward suite's shapes, both forwards, masks and
# dtypes; 6 workers); (2) ab_bwd against the default and cuDNN, d = 128 / 64, N = 4096 / 8192 / 16384.
# Usage: bash benchmarks/session_gpu_run129.sh OUT        (writes OUT/summary.log and OUT/run129.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run129.tar.gz" -C "$w" .; }
{
timeout 150 python3 -m pytest -q -n 6 tests/test_gpu.py -p no:cacheprovider -k "test_hopper_backward and ws-stagger" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
timeout 260 python3 benchmarks/ab_bwd.py --out "$w" --tag stagger --headdims 128,64 --seqlens 4096,8192,16384 \
    --providers gluon-ws,gluon-ws-stagger,sdpa-cudnn --rounds 3 > "$w/stagger.log" 2>&1
echo "ab rc=$?"; grep -E "Error|error|FAIL" "$w/stagger.log" | head -4; grep -A14 "^  d c" "$w/stagger.log"; pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
