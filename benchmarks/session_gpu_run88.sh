#!/usr/bin/env bash
# Fifth device call of the fourteenth session (2026-12-02), NOTES §79: the one-wave decode rule with 4
# or 5 programs an SM. (1) GPU tests of decode (both one-wave launches against the float64 oracle);
# (2) ab_decode --cases onewave2: the rule against the launch before it at batches 52-82 x 4096, cuDNN
# in the same run.
# Usage: bash benchmarks/session_gpu_run88.sh OUT        (writes OUT/summary.log and OUT/run88.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 150 python3 -m pytest -q -x -n 8 tests/test_gpu.py -p no:cacheprovider -k "decode" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
timeout 250 python3 benchmarks/ab_decode.py --out "$w" --cases onewave2 --rounds 3 > "$w/onewave2.log" 2>&1
echo "onewave2 rc=$?"; sed -n '/median over rounds/,$p' "$w/onewave2.log"
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run88.tar.gz" -C "$w" . && rm -rf "$w"
