#!/usr/bin/env bash
# First device call of a session: (1) the GPU tests on the current defaults, the Gluon Hopper
# forward's first run included; (2) the issue-2 sweep in one run (benchmarks/issue2_final.sh);
# (3) the Gluon forward beside the portable TMA forward (benchmarks/ab_fwd.py --loads tma,gluon).
# Plots are dropped on the device (they are rebuilt here by `ioattn bench report`).
# Usage: bash benchmarks/session_gpu_run5.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 240 python3 -m pytest tests/test_gpu.py tests/test_decode.py tests/test_merge.py -n 6 -q -p no:cacheprovider \
    -rfEs > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 3 "$out/test_gpu.log"
mkdir -p "$out/train"
timeout 230 python3 -m ioattn bench train --providers ioattn,sdpa-flash,sdpa-cudnn,sdpa-efficient \
    --out "$out/train" > "$out/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
timeout 100 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_gluon --loads tma,gluon --headdims 64,128 \
    --seqlens 1024,4096,16384 > "$out/ab_gluon.log" 2>&1
echo "ab rc=$?"
grep -E "FAILED|ERROR|Error" "$out/test_gpu.log" | head -n 8
grep -E "^(ioattn|sdpa-flash|sdpa-cudnn) +fwd" "$out/train.log" | tail -n 6
tail -n 14 "$out/ab_gluon.log"
