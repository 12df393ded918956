#!/usr/bin/env bash
# Last device call of the twelfth session (2026-12-02): the final forward (two Q buffers, the paired
# walk, the epilogue's reciprocal with the lse stored first) (1) through the default-dispatch GPU tests
# and the persistent tile loop at its defaults, (2) under compute-sanitizer: memcheck on every kernel
# family of sanitize_small.py (now with several tiles a persistent program), racecheck at d = 128.
# Usage: bash benchmarks/session_gpu_run77.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 90 python3 -m pytest -q -x -n 12 tests/test_gpu.py -p no:cacheprovider \
    -k "default_dispatch or (persistent_tile_loop and False-False)" > "$out/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$out/tests.log")"
timeout 170 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py > "$out/sanitizer_memcheck.log" 2>&1
echo "sanitizer memcheck rc=$?"; tail -n 2 "$out/sanitizer_memcheck.log"
timeout 150 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_small.py --heads 128 \
    > "$out/sanitizer_racecheck.log" 2>&1
echo "sanitizer racecheck rc=$?"; tail -n 2 "$out/sanitizer_racecheck.log"
grep -h -o "at [a-z_]*+0x[0-9a-f]* in [a-z_]*.py:[0-9]*" "$out"/sanitizer_racecheck.log | sed 's/+0x[0-9a-f]*//' \
    | sort | uniq -c
