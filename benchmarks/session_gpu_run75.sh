#!/usr/bin/env bash
# Fourth device call of the twelfth session (2026-12-02): (1) the default-dispatch GPU tests with the
# policy of NOTES §66 (persistent d = 128 causal to 8192, d = 256 causal 2048-4096, d = 64 causal from
# 512); (2) the train sweep, every head dim, SDPA flash and cuDNN in the same run, now in three
# interleaved rounds (NOTES §65): the README table and plots come from it.
# Usage: bash benchmarks/session_gpu_run75.sh OUT        (writes OUT/summary.log, OUT/tests.log, OUT/train/)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 120 python3 -m pytest -q -x -n 8 tests/test_gpu.py -p no:cacheprovider -k "default_dispatch" > "$out/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$out/tests.log")"
timeout 420 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-flash,sdpa-cudnn \
    --out "$out/train" > "$out/train.log" 2>&1
echo "train rc=$?"
sed -n '/== train sweep/,$p' "$out/train.log" | head -n 60
} 2>&1 | tee "$out/summary.log"
