#!/usr/bin/env bash
# ALiBi in both Gluon kernels (ALIBI; NOTES §148): (1) the GPU tests (d = 64 / 128 / 256; no mask, causal, two
# windows; three shapes; with and without a softcap; packed sequences with the causal mask, a window, the ordered
# dQ mode); (2) compute-sanitizer memcheck on the forms (ALiBi alone, and with a softcap).
# Usage: bash benchmarks/session_gpu_run210.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/memcheck*.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 360 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "hopper_alibi or hopper_varlen_alibi" \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
for mode in "--alibi" "--alibi --softcap"; do
    t0=$(date +%s)
    log="$out/memcheck${mode// /}.log"
    timeout 150 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py $mode > "$log" 2>&1
    echo "memcheck $mode rc=$? $(( $(date +%s) - t0 ))s: $(grep -E 'ERROR SUMMARY|done' "$log" | tr '\n' ' ')"
done
} 2>&1 | tee "$out/summary.log"
