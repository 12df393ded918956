#!/usr/bin/env bash
# Device call D of 2026-12-01 (third session): compute-sanitizer memcheck and racecheck on one small
# call of each kernel family (benchmarks/sanitize_small.py: every Gluon forward variant, wg3 included,
# both Gluon backward variants, the portable kernels, decode contiguous and paged-through-TMA).
# Usage: bash benchmarks/session_gpu_run15.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
for tool in memcheck racecheck; do
    timeout 140 compute-sanitizer --tool $tool python3 benchmarks/sanitize_small.py > "$out/sanitizer_$tool.log" 2>&1
    echo "sanitizer $tool rc=$?"; tail -n 2 "$out/sanitizer_$tool.log"
done
grep -h -o "in [a-z_0-9]*kernel[a-z_0-9]*" "$out"/sanitizer_*.log | sort | uniq -c | sort -rn | head -n 8
