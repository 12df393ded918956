#!/usr/bin/env bash
# The Gluon backward's softcap form (SOFTCAP; NOTES §147): (1) its GPU tests (d = 64 / 128 / 256, d = 128
# also as the column split; no mask, causal, two windows; three shapes; bf16 and fp16; packed sequences
# with the causal mask, a window and the ordered dQ mode); (2) compute-sanitizer memcheck on the form
# (fixed length and packed, both d = 128 forms).
# Usage: bash benchmarks/session_gpu_run207.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/memcheck.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 330 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "hopper_backward_softcap or hopper_backward_varlen_softcap" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 200 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --softcap > "$out/memcheck.log" 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 ))s: $(grep -E 'ERROR SUMMARY|done' "$out/memcheck.log" | tr '\n' ' ')"
} 2>&1 | tee "$out/summary.log"
