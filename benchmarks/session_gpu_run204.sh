#!/usr/bin/env bash
# The portable forward's tiles for sliding windows at d = 64 judged by the band's width (NOTES §145,
# dispatch.tiles' ``band``): ab_window.py --pass fwd at d = 64 (Gluon wg3 / portable), and the
# portable kernel's window GPU tests.
# Usage: bash benchmarks/session_gpu_run204.sh OUT        (writes OUT/summary.log, OUT/tests.log, OUT/ab_window_fwd.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 120 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "window and (not hopper or default_policy)" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 300 python3 benchmarks/ab_window.py --pass fwd --out "$out" --headdims 64 --seqlens 4096,16384 \
    --windows 32:0,64:0,128:0,256:0,1024:0,4096:0,128:128 --providers gluon,portable
echo "ab_window fwd rc=$? $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$out/summary.log"
