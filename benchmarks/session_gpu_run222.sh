#!/usr/bin/env bash
# The plan's ALiBi leftovers: (1) memcheck on the backward's softcap + ALiBi split magic form (NOTES §152;
# sanitize_small.py --alibi --softcap --heads 128, forward and backward, fixed length and packed, three
# masks); (2) the ALiBi GPU tests with the launchers' length check (added after the last run).
# Usage: bash benchmarks/session_gpu_run222.sh OUT   (writes OUT/summary.log, OUT/memcheck_alibi_softcap.log,
# OUT/tests_alibi.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 150 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --heads 128 --alibi --softcap \
    > "$out/memcheck_alibi_softcap.log" 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 ))s: $(grep -E 'ERROR SUMMARY|done' "$out/memcheck_alibi_softcap.log" | tr '\n' ' ')"
t0=$(date +%s)
timeout 250 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "hopper_alibi or hopper_varlen_alibi" > "$out/tests_alibi.log" 2>&1
echo "alibi tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests_alibi.log")"
grep -E "^(FAILED|ERROR)" "$out/tests_alibi.log" | head -12
} 2>&1 | tee "$out/summary.log"
