#!/usr/bin/env bash
# The runs behind the issue-2 figures (H200, bf16, 16k tokens, hidden 2048, SDPA measured in the same
# run). With today's defaults one command reproduces them all:
#     python -m ioattn bench train --providers ioattn,sdpa-flash,sdpa-cudnn,sdpa-efficient --out OUT
# The committed results (results/issue2-2026-11-29-s4/train, with the GPU test log beside them) came
# from one run of this command inside benchmarks/session_gpu_run5.sh. Since then d <= 64 non-causal
# N <= 512 uses 64 x 64 tiles (results/issue2-2026-11-29-s4/short-d64).
# Usage: bash benchmarks/issue2_final.sh OUTDIR
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
python3 -m ioattn bench train --providers ioattn,sdpa-flash,sdpa-cudnn,sdpa-efficient --out "$out" > "$out.log" 2>&1
tail -n 40 "$out.log"
