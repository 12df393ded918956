#!/usr/bin/env bash
# Prepared for the next session (written 2026-12-02, eleventh session; NOTES plan items 1 and the
# sanitizer's open point): (1) the d = 128 non-causal forward at N = 16384, which the train sweep put at
# 638 / 653 TFLOP/s and the A/B at 690-695 with the same kernel: the train sweep at d = 128 alone
# (its own order: fwd, bwd, fwd+bwd per point, providers in turn, no rest) three times, then ab_fwd at
# the same point with and without rest, cuDNN in each run; (2) compute-sanitizer racecheck on the
# warp-specialisation control (benchmarks/sanitize_ws_control.py) with each of the forward's
# structural traits, to tell which one the forward's 48 scaffolding reports follow.
# Usage: bash benchmarks/session_gpu_run72.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
for i in 1 2 3; do
    timeout 60 python3 -m ioattn bench train --headdims 128 --seqlens 8192,16384 --providers ioattn,sdpa-cudnn \
        --out "$out/train$i" > "$out/train$i.log" 2>&1
    echo "train $i rc=$?"; grep -E "^(ioattn|sdpa-cudnn) +fwd " "$out/train$i.log"
    rm -rf "$out/train$i"
done
for rest in 0 0.1 1; do
    timeout 90 python3 benchmarks/ab_fwd.py --out "$out" --tag "ab_rest$rest" --headdims 128 --causal 0 \
        --seqlens 8192,16384 --loads gluon-pp-lean --rounds 2 --rest "$rest" > "$out/ab_rest$rest.log" 2>&1
    echo "ab rest $rest rc=$?"; grep -A3 "^  d c" "$out/ab_rest$rest.log"
done
for flags in "" "--local-barrier" "--early-return" "--fwd-partitions" "--early-return --fwd-partitions"; do
    timeout 60 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_ws_control.py $flags \
        >> "$out/racecheck_control.log" 2>&1
    echo "control [$flags] rc=$?: $(grep -h 'RACECHECK SUMMARY' "$out/racecheck_control.log" | tail -n 1)"
done
