#!/usr/bin/env bash
# NOTES §113, with the output's bulk copy, the tile index by multiply-high and (d = 64) two Q buffers
# the persistent kernel's defaults, and the persistent kernel to N = 8192 at d = 128 non-causal:
# (1) the persistent tile-loop GPU tests (now on the new defaults) and the default-dispatch tests;
# (2) compute-sanitizer memcheck at a small shape, d = 64 / 128 (every forward variant, the persistent
# kernel with rows past seqlen_q and several tiles a program); (3) the train sweep at d = 128 / 64, cuDNN
# in the same run; (4) d = 256's policy: the one-tile ping-pong kernel against the persistent one with
# the new options at N = 512 (causal: the one point where the forward is below cuDNN) and 4096 / 8192.
# Usage: bash benchmarks/session_gpu_run140.sh OUT        (writes OUT/summary.log and OUT/run140.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run140.tar.gz" -C "$w" .; }
{
timeout 110 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "persistent_tile_loop or default_dispatch_takes" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
timeout 100 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --heads 64,128 \
    > "$w/sanitizer_memcheck_fwd.log" 2>&1
echo "memcheck rc=$?: $(tail -n 1 "$w/sanitizer_memcheck_fwd.log")"; pack
timeout 250 python3 -m ioattn bench train --headdims 128,64 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$?"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " fwd " | head -n 30
pack
timeout 80 python3 benchmarks/ab_fwd.py --out "$w" --tag fwd256pol --headdims 256 --causal 0,1 \
    --seqlens 512,4096,8192 --loads gluon-pp-lean-crw-ds,gluon-pers-lean-crw-ds --rounds 2 --rest 0.2 \
    > "$w/fwd256pol.log" 2>&1
echo "fwd256pol rc=$?"; grep -A8 "^  d c" "$w/fwd256pol.log"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
