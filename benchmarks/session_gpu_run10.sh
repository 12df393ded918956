#!/usr/bin/env bash
# One device call after the dispatch changes of 2026-12-01 (Gluon forward by hopper.AUTO_MIN_SEQLEN,
# decode PDL on by default):
# (1) the GPU tests; (2) compute-sanitizer: racecheck on the warp-specialisation control kernel, then
# racecheck and memcheck on one small call of each kernel family (Gluon backward included);
# (3) `ioattn bench train` at head dims 128/256 with the new default dispatch beside SDPA flash/cuDNN;
# (4) the focused decode tune against cuDNN (benchmarks/tune_decode.py --focus).
# Usage: bash benchmarks/session_gpu_run10.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 100 python3 -m pytest tests/test_gpu.py tests/test_decode.py tests/test_merge.py -n 14 -q -p no:cacheprovider \
    -rfEs > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
timeout 40 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_ws_control.py > "$out/sanitizer_control.log" 2>&1
echo "control racecheck rc=$?"; tail -n 1 "$out/sanitizer_control.log"
for tool in racecheck memcheck; do
    timeout 80 compute-sanitizer --tool $tool python3 benchmarks/sanitize_small.py > "$out/sanitizer_$tool.log" 2>&1
    echo "sanitizer $tool rc=$?"; tail -n 1 "$out/sanitizer_$tool.log"
done
mkdir -p "$out/train"
timeout 170 python3 -m ioattn bench train --headdims 128,256 --providers ioattn,sdpa-flash,sdpa-cudnn \
    --out "$out/train" > "$out/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
timeout 90 python3 benchmarks/tune_decode.py --focus --out "$out" > "$out/tune_decode.log" 2>&1
echo "tune rc=$?"
grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 6
grep -h "hopper_fwd_kernel\|ws_control_kernel\|hopper_bwd" "$out"/sanitizer_*.log | sort | uniq -c | sort -rn | head -n 6
tail -n 7 "$out/tune_decode.log"
