#!/usr/bin/env bash
# The device run behind the issue-2 figures: tune the backward tiles for head dims 64 and 128, then
# the train sweep (bf16, 16k tokens, hidden 2048) with those tiles against SDPA's flash and cuDNN
# backends measured in the same run. Usage: bash benchmarks/issue2_run.sh OUTDIR
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$out/tune"
timeout 170 python3 benchmarks/tune_tiles.py --out "$out/tune" --kinds bwd --headdims 64,128 --seqlens 16384 \
    > "$out/tune/log" 2>&1
sed -n '/best per/,$p' "$out/tune/log"
export IOATTN_TILES=$(cat "$out/tune/IOATTN_TILES" 2>/dev/null)
echo "IOATTN_TILES=$IOATTN_TILES"
timeout 330 python3 -m ioattn bench train --headdims 64,128 --out "$out" > "$out/bench.log" 2>&1
tail -n 30 "$out/bench.log"
