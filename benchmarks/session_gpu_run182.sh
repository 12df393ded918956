#!/usr/bin/env bash
# NOTES §135: compute-sanitizer memcheck and racecheck on the d = 128 ws backward with its consumers'
# redundant partition barriers dropped from the PTX (sanitize_small.py --bwd-ptx-barriers), both masks,
# the small shape (2 x 300 x 340, GQA 3).
# Usage: bash benchmarks/session_gpu_run182.sh OUT        (writes OUT/summary.log and OUT/run182.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run182.tar.gz" -C "$w" .; }
{
for tool in memcheck racecheck; do
    t0=$(date +%s)
    timeout 150 compute-sanitizer --tool $tool python3 benchmarks/sanitize_small.py --heads 128 --no-forward \
        --bwd-ptx-barriers > "$w/sanitizer_${tool}_bwd.log" 2>&1
    echo "$tool rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/sanitizer_${tool}_bwd.log")"
    grep -E "^=========\s+(Error|Warning).*" "$w/sanitizer_${tool}_bwd.log" | sed -E 's/\+0x[0-9a-f]+//' | sort | uniq -c | head -6
    pack
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
