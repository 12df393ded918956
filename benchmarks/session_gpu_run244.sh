#!/usr/bin/env bash
# NOTES §162, the native d = 256 backward's high dQ half stored behind the next S^T (WS_DQ_HI_LATE):
# (1) ab_bwd at d = 256, late ("gluon-ws-dqhilate") against the default ("gluon-ws"), cuDNN in the same
# process; (2) the GPU test of the three dQ orders (bitwise in the ordered mode, the oracle).
# Usage: bash benchmarks/session_gpu_run244.sh OUT   (writes OUT/summary.log, OUT/ab_bwd.*, OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 150 python3 benchmarks/ab_bwd.py --out "$out" --headdims 256 --seqlens 1024,4096,16384 --rounds 3 \
    --providers gluon-ws,gluon-ws-dqhilate,sdpa-cudnn > "$out/ab_bwd.log" 2>&1
echo "ab_bwd rc=$? $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
timeout 120 python3 -m pytest -q -n 4 tests/test_gpu.py -p no:cacheprovider -k "dq_hi_first" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
tail -n 8 "$out/ab_bwd.log"
} 2>&1 | tee "$out/summary.log"
