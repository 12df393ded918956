#!/usr/bin/env bash
# NOTES §141 (packed q / k / v read in place by the Gluon kernels), part 1: the GPU tests of the new
# path and of the dispatch around it, then the train sweep with packed inputs (--layout qkvpacked),
# cuDNN in the same run. Part 2 (session_gpu_run189.sh) runs the same sweep on the library as it was
# before the change (a copy under prev/, carried to the device, not in the repository).
# Usage: bash benchmarks/session_gpu_run188.sh OUT        (writes OUT/summary.log and OUT/run188.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run188.tar.gz" -C "$w" .; }
{
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "packed_inputs or without_a_view or default_dispatch or backward_through_the_api or backward_d256 or test_hopper_forward_varlen" \
    > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
t0=$(date +%s)  # the separate-layout sweep: 147 s (run187)
timeout 260 python3 -m ioattn bench train --layout qkvpacked --headdims 64,128,256 --providers ioattn,sdpa-cudnn \
    --out "$w/packed-after" > "$w/packed-after.log" 2>&1
echo "sweep after rc=$? $(( $(date +%s) - t0 ))s"; rm -f "$w"/packed-after/*.png
sed -n '/== train sweep/,$p' "$w/packed-after.log" | grep -E " (fwd|bwd) " | head -n 80
pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
