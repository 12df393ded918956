#!/usr/bin/env bash
# NOTES §123: the d = 128 backward with the whole dQ block by one warpgroup a step, by turns
# (WS_DQ_ALTERNATE, ab_bwd "gluon-ws-dqalt"): (1) its GPU tests (the backward suite's shapes, both
# forwards, masks and dtypes; the ordered dQ mode); (2) ab_bwd against the default and cuDNN, d = 128,
# 3 rounds, in two processes.
# Usage: bash benchmarks/session_gpu_run161.sh OUT        (writes OUT/summary.log and OUT/run161.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run161.tar.gz" -C "$w" .; }
{
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "(test_hopper_backward and ws-dqalt) or (test_hopper_backward_deterministic and dqalt)" > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
for p in a b; do
  t0=$(date +%s)
  timeout 200 python3 benchmarks/ab_bwd.py --out "$w" --tag dqalt-$p --headdims 128 --seqlens 1024,4096,16384 \
      --providers gluon-ws,gluon-ws-dqalt,sdpa-cudnn --rounds 3 > "$w/dqalt-$p.log" 2>&1
  echo "ab $p rc=$? $(( $(date +%s) - t0 ))s"; grep -E "Error|error|FAIL" "$w/dqalt-$p.log" | head -4
  grep -A8 "^  d c" "$w/dqalt-$p.log"; pack
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
