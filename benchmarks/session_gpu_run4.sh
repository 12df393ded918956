#!/usr/bin/env bash
# Last device call of the session: forward tile A/B where the issue-2 targets are missed (d=128 at
# N = 512/1024; causal N = 4096 at d = 64/128), then `ioattn bench train` at those points with the
# winners (IOATTN_TILES), SDPA flash/cuDNN in the same run. Usage: bash benchmarks/session_gpu_run4.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$out/short" "$out/mid"
log="$out/steps.log"
timeout 60 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_short --loads tma --headdims 128 --seqlens 512,1024 \
    --tiles "default;64,64,4,3;64,128,4,3;128,128,8,2" >> "$log" 2>&1
echo "ab_short rc=$?"; sed -n '/best\/flash/,/^$/p' "$log" | tail -n 6
timeout 50 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_mid --loads tma --headdims 64,128 --seqlens 4096 --causal 1 \
    --tiles "default;64,64,4,3;128,128,8,2;64,128,8,3" >> "$log" 2>&1
echo "ab_mid rc=$?"; tail -n 3 "$log"
short=$(python3 benchmarks/pick_tiles.py "$out/ab_short.jsonl" 2>>"$log"); echo "short: $short"
mid=$(python3 benchmarks/pick_tiles.py "$out/ab_mid.jsonl" 2>>"$log"); echo "mid: $mid"
IOATTN_TILES="$short" timeout 40 python3 -m ioattn bench train --headdims 128 --seqlens 512,1024 \
    --providers ioattn,sdpa-flash,sdpa-cudnn --out "$out/short" >> "$log" 2>&1
echo "short bench rc=$?"
IOATTN_TILES="$mid" timeout 50 python3 -m ioattn bench train --headdims 64,128 --seqlens 4096 \
    --providers ioattn,sdpa-flash,sdpa-cudnn --out "$out/mid" >> "$log" 2>&1
echo "mid bench rc=$?"; rm -f "$out"/*/*.png
grep -E "^(ioattn|sdpa-flash) +fwd" "$log" | tail -n 12
