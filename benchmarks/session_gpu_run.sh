#!/usr/bin/env bash
# One device call: the GPU tests (compiled kernels incl. decoding and CUDA-graph capture), the decode
# launch sweep, and the train sweep for head dims 64/128 against SDPA flash/cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run.sh OUTDIR  (each step has its own time limit)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=. IOATTN_SKIP_AOT=1
mkdir -p "$out/train"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/env.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$out/env.txt"
timeout 250 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gpu.py tests/test_decode.py > "$out/test_gpu.log" 2>&1
echo "pytest rc=$?"; tail -n 4 "$out/test_gpu.log"
timeout 150 python3 benchmarks/tune_decode.py --out "$out" > "$out/tune_decode.log" 2>&1
echo "tune_decode rc=$?"; sed -n '/best config/,$p' "$out/tune_decode.log"
timeout 150 python3 -m ioattn bench train --headdims 64,128 --providers ioattn,ioattn-tma,sdpa-flash,sdpa-cudnn \
    --out "$out/train" > "$out/train.log" 2>&1
echo "train rc=$?"
rm -f "$out"/train/*.png  # re-rendered locally from results.jsonl (the device returns at most 8 files)
tail -n 3 "$out/train.log"
