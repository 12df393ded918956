#!/usr/bin/env bash
# The forward's ALiBi forms chosen per call (NOTES §149's decision): the magic-number form without a mask at
# d = 64 (wg3) / 128 (128-key tiles), §148's fp32 columns otherwise. (1) the ALiBi GPU tests; (2) memcheck on
# the ALiBi forward and backward; (3) the A/B again with the final policy (gluon) against §148's configuration
# (gluon-was), the portable forward and FlexAttention (d = 128), N = 4096 / 16384, then 512-2048.
# Usage: bash benchmarks/session_gpu_run216.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/memcheck.log,
# OUT/long|short/ab_window_fwd.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 170 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "hopper_alibi or hopper_varlen_alibi or test_hopper_forward_window_default_policy" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 80 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --alibi > "$out/memcheck.log" 2>&1
echo "memcheck --alibi rc=$? $(( $(date +%s) - t0 ))s: $(grep -E 'ERROR SUMMARY|done' "$out/memcheck.log" | tr '\n' ' ')"
mkdir -p "$out/long" "$out/short"
t0=$(date +%s)
timeout 150 python3 benchmarks/ab_window.py --pass fwd --alibi --out "$out/long" --headdims 128,64,256 \
    --seqlens 4096,16384 --windows=-1:-1,-1:0,4096:0 --providers gluon,gluon-was,portable,flex --flex-headdims 128
echo "ab_window long rc=$? $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
timeout 90 python3 benchmarks/ab_window.py --pass fwd --alibi --out "$out/short" --headdims 128,64,256 \
    --seqlens 512,1024,2048 --windows=-1:-1,-1:0 --providers gluon,gluon-was,portable
echo "ab_window short rc=$? $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$out/summary.log"
