#!/usr/bin/env bash
# NOTES §100, after WS_LSE_IN_ACC became the default at d = 128: the d = 128 train sweep with it (cuDNN in
# the same run) and the deterministic backward's GPU tests at d = 128. (Run as one command line on the
# warm machine right after run121; this file records it.)
# Usage: bash benchmarks/session_gpu_run122.sh OUT        (writes OUT/run122.tar.gz)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$out/w"
timeout 200 python3 -m ioattn bench train --headdims 128 --providers ioattn,sdpa-cudnn --out "$out/w/train" \
    > "$out/w/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/w/train/*.png
sed -n '/== train sweep/,$p' "$out/w/train.log" | grep -E " (fwd|bwd) " | head -40
timeout 100 python3 -m pytest -q -n 6 tests/test_gpu.py -p no:cacheprovider -k "test_hopper_backward_deterministic and 128" \
    > "$out/w/tests.log" 2>&1
echo "det tests rc=$?: $(tail -n 1 "$out/w/tests.log")"
tar -czf "$out/run122.tar.gz" -C "$out/w" . && rm -rf "$out/w"
