#!/usr/bin/env bash
# NOTES §156, the Gluon kernels' forms at padded head dims in place (windows, softcap, ALiBi, packed
# sequences; hopper.padded_refusal lifted for d a multiple of 8): (1) their GPU tests
# (test_hopper_padded_forms, test_hopper_padded_varlen); (2) ab_window.py with sliding windows at d = 96 /
# 192, forward and backward, Gluon (in place) against the portable kernels.
# Usage: bash benchmarks/session_gpu_run231.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/win/*.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 240 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "test_hopper_padded_forms or test_hopper_padded_varlen" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
for p in fwd bwd; do
    t0=$(date +%s)
    timeout 150 python3 benchmarks/ab_window.py --out "$out/win" --pass $p --headdims 96,192 --seqlens 2048,16384 \
        --windows 256:0,1024:0,4096:0 --providers gluon,portable
    echo "ab_window $p rc=$? $(( $(date +%s) - t0 ))s"
done
} 2>&1 | tee "$out/summary.log"
