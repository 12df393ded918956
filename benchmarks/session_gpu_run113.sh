#!/usr/bin/env bash
# NOTES §95-§96: after the causal default of hopper.mask_branch (a tile's first-step mask under its own
# branch at d = 128 / 256): (1) the train sweep with the new defaults, every head dim, cuDNN in the same
# run; (2) the Gluon forward's GPU suite under them (as session_gpu_run107.sh: every variant, head dim,
# mask and dtype of test_hopper_forward, varlen, the persistent tile loop, the backward through the API).
# Usage: bash benchmarks/session_gpu_run113.sh OUT        (writes OUT/summary.log and OUT/run113.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run113.tar.gz" -C "$w" .; }
{
timeout 300 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$?"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep " fwd " | head -n 40
pack
timeout 200 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider \
    -k "(test_hopper_forward or backward_through_the_api) and not exp2_fma and not conditional_rescale and not accumulator_stores and not q_in_registers and not deferred_row_sum and not mask_branch" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
