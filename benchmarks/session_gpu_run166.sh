#!/usr/bin/env bash
# NOTES §127: dQ added by the consumers' 16-byte reductions into the flat accumulator (WS_DQ_RED, ab_bwd "gluon-ws-dqred"):
# (1) its GPU tests (the backward suite's shapes, both forwards, masks and dtypes, d = 128); (2) ab_bwd
# against the default and cuDNN, d = 128, 3 rounds, two processes.
# Usage: bash benchmarks/session_gpu_run166.sh OUT        (writes OUT/summary.log and OUT/run166.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run166.tar.gz" -C "$w" .; }
ab() {  # tag headdims
  t0=$(date +%s)
  timeout 150 python3 benchmarks/ab_bwd.py --out "$w" --tag "$1" --headdims "$2" --seqlens 1024,4096,16384 \
      --providers gluon-ws,gluon-ws-dqred,sdpa-cudnn --rounds 3 > "$w/$1.log" 2>&1
  echo "$1 rc=$? $(( $(date +%s) - t0 ))s"; grep -E "Error|error|FAIL" "$w/$1.log" | head -4
  grep -A8 "^  d c" "$w/$1.log"; pack
}
{
t0=$(date +%s)
timeout 260 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "test_hopper_backward and ws-dqred and 128" \
    > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
ab red128-a 128
ab red128-b 128
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
