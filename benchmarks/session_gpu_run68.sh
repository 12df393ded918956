#!/usr/bin/env bash
# Third device call of the eleventh session (2026-12-02): the defaults this session made (NOTES §59
# d = 256's dQ high half through the Q ring, the only form now; §61 d = 256's forward output through
# the Q buffer; §62 fewer masked key tiles in the two-warpgroup kernels; d = 128 causal on the Gluon
# forward from N = 512): (1) the GPU tests of the paths they touch, -v; (2) the train sweep for the
# README table, every head dim, SDPA's flash and cuDNN backends in the same run.
# Usage: bash benchmarks/session_gpu_run68.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 170 python3 -m pytest tests/test_gpu.py -n 16 -v -p no:cacheprovider -rfE \
    -k "(test_hopper_backward and ws and 256) or test_hopper_backward_deterministic or (fewer_masks and shape5) \
        or via_q or default_dispatch or persistent_tile_loop or (accumulator_stores and 256)" \
    > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E " FAILED | ERROR " "$out/test_gpu.log" | head -n 5
mkdir -p "$out/train"
timeout 400 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-flash,sdpa-cudnn \
    --out "$out/train" > "$out/train/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
python3 benchmarks/train_vs_cudnn.py "$out/train/results.jsonl" --modes fwd,bwd
