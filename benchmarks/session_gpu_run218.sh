#!/usr/bin/env bash
# NOTES §150's decision (d = 128 masked ALiBi in the magic form; causal from seqlen_q 1024): (1) the ALiBi GPU
# tests with the final policy and both causal / windowed forms at d = 128 (test_hopper_alibi_forward_forms);
# (2) the short causal lengths again, gluon against gluon-was (512: the fp32 form both; 1024 on: the magic form).
# Usage: bash benchmarks/session_gpu_run218.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/short/ab_window_fwd.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 170 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "hopper_alibi or hopper_varlen_alibi" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
mkdir -p "$out/short"
t0=$(date +%s)
timeout 60 python3 benchmarks/ab_window.py --pass fwd --alibi --out "$out/short" --headdims 128 \
    --seqlens 512,1024,2048,16384 --windows=-1:0 --providers gluon,gluon-was,portable
echo "ab_window short rc=$? $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$out/summary.log"
