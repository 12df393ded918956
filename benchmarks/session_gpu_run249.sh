#!/usr/bin/env bash
# (A record: the 80-row form was removed after this run, NOTES §165; it runs against commit 6c721e4.)
# NOTES §165, second build of d = 128's 80-row step (the 16 rows' S^T from zero with lse in the exponent, their
# dP^T issued after P^T's conversion, D subtracted at dS^T: no accumulator start written behind an issued
# product, so S^T, S^T's 16 rows and dP^T issue back to back): (1) its GPU tests; (2) ab_bwd bf16 (the build
# spills 620 B, 131 spill instructions in the loop) and fp16 (24 B, none in the loop: the structure's own
# figure), two fp16 processes in both orders, cuDNN in each.
# Usage: bash benchmarks/session_gpu_run249.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/ab_bwd_*)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 150 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "test_hopper_backward_extra_rows" \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
for run in bf16:a fp16:a fp16:b; do
  dt=${run%:*}; order=${run#*:}
  if [ $order = a ]; then provs=gluon-ws,gluon-ws-xr16,sdpa-cudnn; else provs=gluon-ws-xr16,gluon-ws,sdpa-cudnn; fi
  t0=$(date +%s)
  timeout 150 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_${dt}_$order --dtype $dt --headdims 128 \
      --causal 0 --seqlens 1024,4096,16384 --rounds 3 --providers $provs > "$out/ab_bwd_${dt}_$order.log" 2>&1
  echo "ab_bwd $dt $order rc=$? $(( $(date +%s) - t0 ))s"
  tail -n 4 "$out/ab_bwd_${dt}_$order.log"
done
} 2>&1 | tee "$out/summary.log"
