#!/usr/bin/env bash
# Device call E of 2026-12-01 (seventh session): NOTES §46-§48.
# (1) host time a decode call, cached launch on / off interleaved in one process, cuDNN's;
# (2) ab_fwd at short sequences (N = 512-2048, both masks, d = 64 / 128 / 256): the portable kernel
#     against the Gluon variants with the lean softmax (ping-pong, persistent, wg3), 2 rounds with rest:
#     do AUTO_MIN_SEQLEN / PERSISTENT_MAX_SEQLEN move now?
# (3) `ioattn bench decode` with the final code (the table of issue 4).
# Usage: bash benchmarks/session_gpu_run46.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 90 python3 benchmarks/host_profile.py --calls 200 --top 25 > "$out/host_profile.log" 2>&1
echo "host rc=$?"; tail -n 9 "$out/host_profile.log"
timeout 260 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_short --headdims 64,128,256 --seqlens 512,1024,2048 \
    --causal 0,1 --loads tma,gluon-pp,gluon-pers,gluon-wg3 --rounds 2 --rest 0.1 > "$out/ab_short.log" 2>&1
echo "ab rc=$?"; grep -v "has no head dim" "$out/ab_short.log" | tail -n 19
mkdir -p "$out/decode"
timeout 150 python3 -m ioattn bench decode --out "$out/decode" --providers ioattn,ioattn-paged,sdpa-cudnn \
    > "$out/decode/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode/*.png
python3 benchmarks/decode_table.py "$out/decode/results.jsonl"
