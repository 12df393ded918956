#!/usr/bin/env bash
# NOTES §111-§112: with the backward's one preprocess launch as the only form: (1) the backward through
# the API and the ordered (deterministic) mode's GPU tests; (2) compute-sanitizer memcheck on the
# backward at a small shape, d = 64 / 128 (the new writes of the padded rows and the flat accumulator);
# (3) the train sweep at d = 128 / 64, cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run137.sh OUT        (writes OUT/summary.log and OUT/run137.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run137.tar.gz" -C "$w" .; }
{
timeout 90 python3 -m pytest -q -n 6 tests/test_gpu.py -p no:cacheprovider \
    -k "backward_through_the_api or test_hopper_backward_deterministic" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
timeout 80 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --heads 64,128 --no-forward \
    > "$w/sanitizer_memcheck_bwd.log" 2>&1
echo "memcheck rc=$?: $(tail -n 1 "$w/sanitizer_memcheck_bwd.log")"; pack
timeout 250 python3 -m ioattn bench train --headdims 128,64 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$?"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " (fwd|bwd) " | head -n 60
pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
