#!/usr/bin/env bash
# (1) compute-sanitizer on NOTES §153's backward (dQ over each warpgroup's own keys, d = 128):
# memcheck with forms 1 and 2, racecheck with form 2 and the default (its reports, to compare line by
# line), sanitize_small.py --no-forward --heads 128 and --varlen --heads 128; (2) the plan's ALiBi
# leftovers: memcheck on the backward's softcap + ALiBi form (sanitize_small.py --alibi --softcap
# --heads 128) and the ALiBi GPU tests with the launchers' length check.
# Usage: bash benchmarks/session_gpu_run222.sh OUT   (writes OUT/summary.log, OUT/*.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
for job in "memcheck 1 --no-forward" "memcheck 2 --no-forward" "memcheck 2 --varlen" "racecheck 2 --no-forward" \
           "racecheck 0 --no-forward" "memcheck - --alibi --softcap"; do
    set -- $job
    tool=$1 own=$2; shift 2
    name="${tool}_own${own}$(echo "$*" | tr -d ' -' | sed 's/^/_/')"
    opt=""; [ "$own" != "-" ] && opt="--dq-own-keys $own"
    t0=$(date +%s)
    timeout 150 compute-sanitizer --tool $tool python3 benchmarks/sanitize_small.py --heads 128 $opt "$@" \
        > "$out/$name.log" 2>&1
    echo "$name rc=$? $(( $(date +%s) - t0 ))s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|done' "$out/$name.log" | tr '\n' ' ')"
done
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "hopper_alibi or hopper_varlen_alibi" > "$out/tests_alibi.log" 2>&1
echo "alibi tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests_alibi.log")"
grep -E "^(FAILED|ERROR)" "$out/tests_alibi.log" | head -12
} 2>&1 | tee "$out/summary.log"
