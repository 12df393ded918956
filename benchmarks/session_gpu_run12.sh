#!/usr/bin/env bash
# Device call A of 2026-12-01 (third session): data for the per-length policies of the new defaults.
# (1) the Gluon backward's GPU tests (D now from the preprocess kernel, dQ scaled and cast in one
#     pass) and the default-policy / deterministic test, 6 workers (14 ran out of GPU memory);
# (2) `ioattn bench train` at head dims 64/128 with everything portable by environment
#     (IOATTN_HOPPER=0, IOATTN_HOPPER_BWD=0) as "ioattn", beside "ioattn-hopper" (the Gluon forward:
#     wg3 at d=64, ping-pong at d=128) and "ioattn-hopper-bwd" (the Gluon "ws" backward) and cuDNN:
#     every length's forward and backward A/B in one run;
# (3) the paged decode focus sweep (`tune_decode.py --focus --paged`);
# (4) the backward A/B at 4k/16k (the effect of the D / dQ passes on "ws" alone).
# Usage: bash benchmarks/session_gpu_run12.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 130 python3 -m pytest tests/test_gpu.py -k "hopper_backward or backward_default" -n 6 -q -p no:cacheprovider \
    -rfE > "$out/test_gpu_bwd.log" 2>&1
echo "bwd tests rc=$?"; tail -n 1 "$out/test_gpu_bwd.log"
mkdir -p "$out/train"
IOATTN_HOPPER=0 IOATTN_HOPPER_BWD=0 timeout 250 python3 -m ioattn bench train --headdims 64,128 \
    --providers ioattn,ioattn-hopper,ioattn-hopper-bwd,sdpa-cudnn --out "$out/train" > "$out/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
timeout 90 python3 benchmarks/tune_decode.py --focus --paged --out "$out" > "$out/tune_paged.log" 2>&1
echo "tune paged rc=$?"
timeout 60 python3 benchmarks/ab_bwd.py --out "$out" --providers portable,gluon-ws,sdpa-cudnn \
    --seqlens 4096,16384 > "$out/ab_bwd.log" 2>&1
echo "ab_bwd rc=$?"
grep -E "FAILED|ERROR" "$out/test_gpu_bwd.log" | head -n 6
grep -c . "$out/train/results.jsonl"
grep -E "contiguous default" "$out/tune_paged.log"; tail -n 6 "$out/tune_paged.log"
tail -n 5 "$out/ab_bwd.log"
