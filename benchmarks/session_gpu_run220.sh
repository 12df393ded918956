#!/usr/bin/env bash
# Softcap + ALiBi in d = 128's ws backward with the split magic form (NOTES §152): (1) the GPU tests of that case
# (test_hopper_alibi at d = 128 with a softcap: four masks, three shapes; the varlen ALiBi tests with a softcap at every head dim);
# (2) the A/B against the portable backward, N = 4096 / 16384, no mask, causal, (4096, 0).
# Usage: bash benchmarks/session_gpu_run220.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/ab_window.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 100 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "(test_hopper_alibi and 20.0 and 128]) or (test_hopper_varlen_alibi and 20.0)" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 70 python3 benchmarks/ab_window.py --pass bwd --alibi --softcap 50 --out "$out" --headdims 128 \
    --seqlens 4096,16384 --windows=-1:-1,-1:0,4096:0 --providers gluon,portable
echo "ab_window rc=$? $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$out/summary.log"
