#!/usr/bin/env bash
# Fourth device call of the seventeenth session (2026-12-02), on the machine still warm from run102,
# after NOTES §90's final policy (the row sum deferred in the ping-pong and persistent kernels at
# d = 128 / 256 and in wg3 non-causal): (1) the train sweep with the new defaults, every head dim,
# cuDNN in the same run; (2) the option's wg3 GPU tests and the default dispatch's.
# Usage: bash benchmarks/session_gpu_run103.sh OUT        (writes OUT/run103.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 300 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$?"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep " fwd \| bwd " | head -n 80
timeout 120 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider \
    -k "deferred_row_sum and wg3 or default_dispatch" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
tar -czf "$out/run103.tar.gz" -C "$w" .
