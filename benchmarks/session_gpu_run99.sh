#!/usr/bin/env bash
# Third device call of the sixteenth session (2026-12-02), after NOTES §87's decision (Q as S = Q K^T's
# register operand on by default in the two-warpgroup kernels at d = 128): (1) the train sweep with the
# new defaults, every head dim, cuDNN in the same run; (2) the default dispatch's GPU tests and the
# persistent tile loop (now with it at d = 128); (3) memcheck on the forward at d = 128.
# The archive is rewritten after each step, so a call cut short still returns what it finished.
# Usage: bash benchmarks/session_gpu_run99.sh OUT        (writes OUT/summary.log and OUT/run99.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
snap() { tar -czf "$out/run99.tar.gz" -C "$w" .; }
{
timeout 270 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-cudnn \
    --out "$w/train" > "$w/train.log" 2>&1
echo "train rc=$?"; rm -f "$w"/train/*.png; snap
sed -n '/== train sweep/,$p' "$w/train.log" | grep " fwd \| bwd " | head -n 80
timeout 110 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider \
    -k "default_dispatch or persistent_tile_loop" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"; snap
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
timeout 90 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --heads 128 \
    > "$w/sanitizer_memcheck_d128.log" 2>&1
echo "memcheck d=128 rc=$?: $(tail -n 1 "$w/sanitizer_memcheck_d128.log")"
} 2>&1 | tee "$out/summary.log"
snap && rm -rf "$w"
