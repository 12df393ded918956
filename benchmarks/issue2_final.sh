#!/usr/bin/env bash
# Last device run behind the issue-2 figures: the GPU tests, then the train sweep (bf16, 16k tokens,
# hidden 2048, head dims 64 and 128) with ioattn's pointer and descriptor (TMA) forwards against
# SDPA's flash and cuDNN backends, measured in the same run. Usage: bash benchmarks/issue2_final.sh OUTDIR
set -u
out=${1:?outdir}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 230 python3 -m pytest -q tests/test_gpu.py > "$out/test_gpu.log" 2>&1
tail -n 3 "$out/test_gpu.log"
timeout 200 python3 -m ioattn bench train --headdims 64,128 --out "$out" > "$out/bench.log" 2>&1
tail -n 52 "$out/bench.log" | cut -c1-110
