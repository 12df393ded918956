#!/usr/bin/env bash
# NOTES §153: the d = 128 backward with each warpgroup's dQ over its own keys, no dS^T exchange
# (WS_DQ_OWN_KEYS 1, and 2: warpgroup 1 started half a step behind; ab_bwd "gluon-ws-dqown",
# "gluon-ws-dqownlag"): (1) their GPU tests (the backward suite's shapes, both forwards, masks and
# dtypes; the ordered mode, packed sequences, a window, softcap + ALiBi); (2) ab_bwd against the
# default and cuDNN, d = 128, 3 rounds, in two processes (the ordered modes beside them in the first).
# Usage: bash benchmarks/session_gpu_run221.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/dqown-*.{log,jsonl})
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 260 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "(test_hopper_backward and ws-dqown and -128-) or test_hopper_backward_dq_own_keys_forms" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
for p in a b; do
  t0=$(date +%s)
  provs=gluon-ws,gluon-ws-dqown,gluon-ws-dqownlag,sdpa-cudnn
  [ $p = a ] && provs=$provs,gluon-ws-det,gluon-ws-dqown-det
  timeout 150 python3 benchmarks/ab_bwd.py --out "$out" --tag dqown-$p --headdims 128 --seqlens 1024,4096,16384 \
      --providers $provs --rounds 3 > "$out/dqown-$p.log" 2>&1
  echo "ab $p rc=$? $(( $(date +%s) - t0 ))s"; grep -E "Error|error|FAIL" "$out/dqown-$p.log" | head -4
  grep -A8 "^  d c" "$out/dqown-$p.log"
done
} 2>&1 | tee "$out/summary.log"
