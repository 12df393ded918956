#!/usr/bin/env bash
# A short first look at the Gluon variants (a few minutes of device time): the A/B at d=128 N=16384
# (each variant checked against the float64 oracle first), then the single-key-tile GPU tests.
# Every step under timeout: a wrong barrier would hang. Usage: bash benchmarks/session_gpu_quick_gluon.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 70 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_gluon2 --loads tma,gluon,gluon-pp,gluon-split \
    --headdims 128 --seqlens 16384 --causal 0 > "$out/ab_gluon2.log" 2>&1
echo "ab rc=$?"; tail -n 3 "$out/ab_gluon2.log"
timeout 60 python3 -m pytest tests/test_gpu.py -k "hopper and 129" -n 6 -q -p no:cacheprovider -rfE \
    > "$out/test_gluon.log" 2>&1
echo "tests rc=$?"; tail -n 2 "$out/test_gluon.log"
