#!/usr/bin/env bash
# Seventh device call of the fourteenth session (2026-12-02), NOTES §81: the one-wave decode launch on
# paged caches (pointer loads). (1) GPU tests of decode (the one-wave launch, contiguous and paged,
# against the float64 oracle; the load-path policy); (2) ab_decode --cases onewave_paged: the rule
# against the paged launch before it, batches 52-80 x 4096.
# Usage: bash benchmarks/session_gpu_run90.sh OUT        (writes OUT/summary.log and OUT/run90.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 150 python3 -m pytest -q -x -n 8 tests/test_gpu.py -p no:cacheprovider -k "decode" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
timeout 200 python3 benchmarks/ab_decode.py --out "$w" --cases onewave_paged --rounds 3 > "$w/onewave_paged.log" 2>&1
echo "onewave_paged rc=$?"; sed -n '/median over rounds/,$p' "$w/onewave_paged.log"
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run90.tar.gz" -C "$w" . && rm -rf "$w"
