#!/usr/bin/env bash
# Device call F of 2026-12-01 (fourth session): the Gluon forward's V rows past a sequence's end
# zeroed by the producer (KV_TAIL; NOTES §38). (1) the Gluon forward GPU tests (every variant; NaN in
# the next batch element's V and in a packed batch's unowned rows); (2) ab_fwd at N=16000 (a tail)
# against 16384 (none); (3) ab_varlen: the Gluon varlen forward against the portable one.
# Usage: bash benchmarks/session_gpu_run23.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 200 python3 -m pytest tests/test_gpu.py -k "hopper_forward" -n 8 -q -p no:cacheprovider -rfE \
    > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
timeout 100 python3 benchmarks/ab_fwd.py --out "$out" --loads gluon-pp,gluon-wg3,gluon-pers --headdims 64,128 \
    --seqlens 16000,16384,2000,2048 > "$out/ab_fwd.log" 2>&1
echo "ab_fwd rc=$?"
timeout 100 python3 benchmarks/ab_varlen.py --out "$out" > "$out/ab_varlen.log" 2>&1
echo "ab_varlen rc=$?"
grep -E "FAILED|ERROR|Timeout" "$out/test_gpu.log" | head -n 10
grep -E "^ *[0-9]+ [01] +[0-9]+ " "$out/ab_fwd.log" | tail -n 16
cat "$out/ab_varlen.log" | tail -n 10
