#!/usr/bin/env bash
# Last device call of the twelfth session (2026-12-02): compute-sanitizer memcheck and racecheck on
# sanitize_small.py with this session's forward (two Q buffers, the paired walk, several tiles a
# persistent program, the epilogue's reciprocal), and the racecheck report summarised by source line.
# Usage: bash benchmarks/session_gpu_run77.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
for tool in memcheck racecheck; do
    timeout 220 compute-sanitizer --tool $tool python3 benchmarks/sanitize_small.py > "$out/sanitizer_$tool.log" 2>&1
    echo "sanitizer $tool rc=$?"; tail -n 2 "$out/sanitizer_$tool.log"
done
grep -h -o "at [a-z_]*+0x[0-9a-f]* in [a-z_]*.py:[0-9]*" "$out"/sanitizer_racecheck.log | sed 's/+0x[0-9a-f]*//' \
    | sort | uniq -c
