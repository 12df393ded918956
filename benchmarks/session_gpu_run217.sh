#!/usr/bin/env bash
# d = 128's masked ALiBi calls in the magic form at 128-key tiles, its columns split as the masks' (NOTES §150):
# (1) the ALiBi GPU tests; (2) memcheck on the ALiBi forward and backward; (3) the A/B against §148's fp32
# columns at 64-key tiles (gluon-was) and the portable forward: no mask, causal, (4096, 0) at N = 4096 / 16384;
# no mask and causal at 512-2048.
# Usage: bash benchmarks/session_gpu_run217.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/memcheck.log,
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
timeout 90 python3 benchmarks/ab_window.py --pass fwd --alibi --out "$out/long" --headdims 128 \
    --seqlens 4096,16384 --windows=-1:-1,-1:0,4096:0 --providers gluon,gluon-was,portable
echo "ab_window long rc=$? $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
timeout 60 python3 benchmarks/ab_window.py --pass fwd --alibi --out "$out/short" --headdims 128 \
    --seqlens 512,1024,2048 --windows=-1:-1,-1:0 --providers gluon,gluon-was,portable
echo "ab_window short rc=$? $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$out/summary.log"
