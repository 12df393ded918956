#!/usr/bin/env bash
# NOTES §113, last run: with d = 256's persistent range now 512 ... 8192 for both masks: (1) the
# default-dispatch GPU tests (the policy's points); (2) the train sweep at d = 256, cuDNN in the same
# run; (3) compute-sanitizer racecheck at a small shape, d = 128 (every forward variant, the persistent
# kernel's copies from the Q buffers among them).
# Usage: bash benchmarks/session_gpu_run141.sh OUT        (writes OUT/summary.log and OUT/run141.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run141.tar.gz" -C "$w" .; }
{
timeout 60 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "default_dispatch_takes" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
timeout 200 python3 -m ioattn bench train --headdims 256 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$?"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " (fwd|bwd) " | head -n 30
pack
timeout 160 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_small.py --heads 128 \
    > "$w/sanitizer_racecheck_fwd.log" 2>&1
echo "racecheck rc=$?: $(tail -n 1 "$w/sanitizer_racecheck_fwd.log")"
grep -E "^=========\s+(Error|Warning).*" "$w/sanitizer_racecheck_fwd.log" | sort | uniq -c | head -8
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
