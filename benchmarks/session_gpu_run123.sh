#!/usr/bin/env bash
# NOTES §100-§101: compute-sanitizer on the Gluon backward after this session's changes (the flat dQ tile,
# its bulk reduce-add box and the reorder kernel; lse in S^T's accumulator at d = 128): memcheck and
# racecheck at a small shape, d = 64 / 128, the backward kernels and the decode calls (--no-forward).
# Usage: bash benchmarks/session_gpu_run123.sh OUT        (writes OUT/summary.log and OUT/run123.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run123.tar.gz" -C "$w" .; }
{
timeout 80 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --heads 64,128 --no-forward \
    > "$w/sanitizer_memcheck_bwd.log" 2>&1
echo "memcheck rc=$?: $(tail -n 1 "$w/sanitizer_memcheck_bwd.log")"; pack
timeout 100 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_small.py --heads 64,128 --no-forward \
    > "$w/sanitizer_racecheck_bwd.log" 2>&1
echo "racecheck rc=$?: $(tail -n 1 "$w/sanitizer_racecheck_bwd.log")"
grep -h -o "at [a-z_]*+0x[0-9a-f]* in [a-z_]*.py:[0-9]*" "$w/sanitizer_racecheck_bwd.log" | sed 's/+0x[0-9a-f]*//' \
    | sort | uniq -c | sort -rn | head -12
pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
