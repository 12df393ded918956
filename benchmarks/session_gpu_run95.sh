#!/usr/bin/env bash
# Third device call of the fifteenth session (2026-12-02), after NOTES §84's decision (conditional
# rescaling by the warp on by default, but the persistent kernel at d = 64): (1) the train sweep with
# the new defaults, every head dim, cuDNN in the same run; (2) the default dispatch's GPU tests and the
# persistent tile loop (now with it); (3) memcheck on the forward at d = 128 (the inline-PTX branch).
# The archive is rewritten after each step, so a call cut short still returns what it finished.
# Usage: bash benchmarks/session_gpu_run95.sh OUT        (writes OUT/summary.log and OUT/run95.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
snap() { tar -czf "$out/run95.tar.gz" -C "$w" .; }
{
timeout 260 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-cudnn \
    --out "$w/train" > "$w/train.log" 2>&1
echo "train rc=$?"; rm -f "$w"/train/*.png; snap
sed -n '/== train sweep/,$p' "$w/train.log" | grep " fwd \| bwd " | head -n 80
timeout 110 python3 -m pytest -q -n 12 tests/test_gpu.py -p no:cacheprovider \
    -k "default_dispatch or persistent_tile_loop" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"; snap
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
timeout 100 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --heads 128 \
    > "$w/sanitizer_memcheck_d128.log" 2>&1
echo "memcheck d=128 rc=$?: $(tail -n 1 "$w/sanitizer_memcheck_d128.log")"
} 2>&1 | tee "$out/summary.log"
snap && rm -rf "$w"
