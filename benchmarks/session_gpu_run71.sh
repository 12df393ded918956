#!/usr/bin/env bash
# Sixth device call of the eleventh session (2026-12-02): the variant policy run 70 measured (NOTES
# §64: d = 256 non-causal always ping-pong, d = 64 causal persistent from 1024 to 4096): the default
# dispatch GPU test, then the train sweep again for the README table (cuDNN, SDPA flash in the same run).
# Usage: bash benchmarks/session_gpu_run71.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 90 python3 -m pytest tests/test_gpu.py -n 12 -v -p no:cacheprovider -rfE -k "default_dispatch" \
    > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E " FAILED | ERROR " "$out/test_gpu.log" | head -n 5
mkdir -p "$out/train"
timeout 300 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-flash,sdpa-cudnn \
    --out "$out/train" > "$out/train/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
python3 benchmarks/train_vs_cudnn.py "$out/train/results.jsonl" --modes fwd
