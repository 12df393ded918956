#!/usr/bin/env bash
# Device call F of 2026-12-01 (seventh session), the SM clock and board power sampled every 50 ms:
# (1) GPU tests of decode and merge with the memoized plan and cached launches;
# (2) the sustained-load probe with the lean softmax (NOTES §43 measured 2.64 J a call against cuDNN's
#     2.51 at d=128 N=16384 without it);
# (3) the train sweep at d=128 again (a second run of §47's figures, cuDNN in the same run).
# Usage: bash benchmarks/session_gpu_run47.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 90 python3 -m pytest tests/test_decode.py tests/test_merge.py tests/test_launcher.py -n 8 -q -p no:cacheprovider \
    -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
bash benchmarks/smi_log.sh "$out/smi.csv" 50 &
smi=$!
timeout 80 python3 benchmarks/power_probe.py --smi "$out/smi.csv" --out "$out/power.jsonl" > "$out/power.log" 2>&1
echo "power rc=$?"
kill $smi 2>/dev/null
tail -n 12 "$out/power.log"
mkdir -p "$out/train"
timeout 120 python3 -m ioattn bench train --headdims 128 --providers ioattn,sdpa-cudnn --out "$out/train" \
    > "$out/train/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
python3 benchmarks/train_vs_cudnn.py "$out/train/results.jsonl" --modes fwd,bwd
