#!/usr/bin/env bash
# The Gluon forward's ALiBi by the magic-number conversion (NOTES §149): (1) the GPU tests of the ALiBi forms
# (now wg3 at d = 64, 128-key tiles at d = 128 non-causal) and a subset without ALiBi (the flag's off path);
# (2) compute-sanitizer memcheck on the ALiBi forward; (3) the A/B against the configuration before
# (gluon-was: fp32 columns, d = 128 at 64-key tiles, d = 64 in pingpong) and the portable forward, N = 4096
# and 16384 with no mask, causal and (4096, 0); then 512-2048; then d = 64 with a softcap too (wg3 spills 76 B
# causal there).
# Usage: bash benchmarks/session_gpu_run215.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/memcheck.log,
# OUT/long|short|softcap/ab_window_fwd.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 230 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "hopper_alibi or hopper_varlen_alibi or test_hopper_forward_window_default_policy or test_hopper_backward_through_the_api or test_hopper_forward_softcap" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 80 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --alibi \
    > "$out/memcheck.log" 2>&1
echo "memcheck --alibi rc=$? $(( $(date +%s) - t0 ))s: $(grep -E 'ERROR SUMMARY|done' "$out/memcheck.log" | tr '\n' ' ')"
mkdir -p "$out/long" "$out/short" "$out/softcap"
t0=$(date +%s)
timeout 140 python3 benchmarks/ab_window.py --pass fwd --alibi --out "$out/long" --headdims 128,64,256 \
    --seqlens 4096,16384 --windows=-1:-1,-1:0,4096:0 --providers gluon,gluon-was,portable
echo "ab_window long rc=$? $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
timeout 90 python3 benchmarks/ab_window.py --pass fwd --alibi --out "$out/short" --headdims 128,64 \
    --seqlens 512,1024,2048 --windows=-1:-1,-1:0 --providers gluon,gluon-was,portable
echo "ab_window short rc=$? $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
timeout 55 python3 benchmarks/ab_window.py --pass fwd --alibi --softcap 50 --out "$out/softcap" --headdims 64 \
    --seqlens 4096,16384 --windows=-1:-1,-1:0 --providers gluon,gluon-was,portable
echo "ab_window softcap rc=$? $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$out/summary.log"
