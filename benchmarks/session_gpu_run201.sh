#!/usr/bin/env bash
# The Gluon forward's sliding-window form (WINDOW; NOTES §145): (1) its GPU tests (fixed length, every
# variant with the form, six windows, three shapes; packed sequences) and the backward's window tests,
# whose forward now takes it; (2) compute-sanitizer memcheck (d = 64 / 128 / 256) and racecheck (d =
# 128) at a small shape (sanitize_small.py --window: fixed length and packed, three windows).
# Usage: bash benchmarks/session_gpu_run201.sh OUT        (writes OUT/summary.log, OUT/tests.log, OUT/run201.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run201.tar.gz" -C "$w" .; }
{
t0=$(date +%s)  # run196's 84 backward window + varlen tests: 75 s
timeout 330 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "window" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
for job in "memcheck 64,128,256" "racecheck 128"; do
    set -- $job
    t0=$(date +%s)
    timeout 100 compute-sanitizer --tool $1 python3 benchmarks/sanitize_small.py --heads $2 --window \
        > "$w/sanitizer_$1.log" 2>&1
    echo "$1 d=$2 rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/sanitizer_$1.log")"
    grep -E "^=========\s+(Error|Warning).*" "$w/sanitizer_$1.log" | sed -E 's/\+0x[0-9a-f]+//' | sort | uniq -c | head -6
    pack
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
