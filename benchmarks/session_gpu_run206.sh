#!/usr/bin/env bash
# The Gluon forward's softcap form (SOFTCAP; NOTES §146): (1) its GPU tests (every variant with the form,
# alone, causal and two windows, three shapes, scores saturating the cap); (2) ab_window.py --pass fwd
# --softcap 50: Gluon / portable at every head dim, FlexAttention at d = 128, no window, causal and (4096, 0).
# Usage: bash benchmarks/session_gpu_run206.sh OUT        (writes OUT/summary.log, OUT/tests.log, OUT/ab_window_fwd.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "hopper_forward_softcap" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 240 python3 benchmarks/ab_window.py --pass fwd --softcap 50 --out "$out" --headdims 128,256,64 \
    --seqlens 4096,16384 --windows=-1:-1,-1:0,4096:0 --providers gluon,portable,flex --flex-headdims 128
echo "ab_window fwd softcap rc=$? $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$out/summary.log"
