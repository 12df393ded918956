#!/usr/bin/env bash
# NOTES §122 follow-up: (1) the trim at d = 256, N = 4096 / 8192 in a second process (order reversed;
# run158: +1.6 / +0.8 %); (2) 64-key tiles with the trim at d = 128 and d = 64, causal: with 64-key
# tiles warpgroup 0's waste is a whole tile, skipped with no new code (as at d = 256), where the
# 128-key half-width step cost more code than it saved. §86 had 64-key tiles level with 128 at d = 128
# causal N = 512 without the skip. ab_fwd, 3 interleaved rounds, two processes, cuDNN in the same process.
# Usage: bash benchmarks/session_gpu_run159.sh OUT        (writes OUT/summary.log and OUT/run159.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run159.tar.gz" -C "$w" .; }
ab() {  # tag headdim seqlens loads
    local t0=$(date +%s)
    timeout 150 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal 1 --seqlens "$3" \
        --loads "$4" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$? $(( $(date +%s) - t0 ))s"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A4 "^  d c" "$w/$1.log"
    pack
}
L128="gluon-pers-lean-crw-qr-ds"; N128="gluon-pers-lean-crw-n64-qr-ds-dt"; S128="gluon-pers-lean-crw-n64-s4-qr-ds-dt"
L64="gluon-pers-lean-ds"; N64="gluon-pers-lean-n64-ds-dt"; S64="gluon-pers-lean-n64-s4-ds-dt"
{
ab dt256d 256 4096,8192 "gluon-pers-lean-crw-ds,gluon-pers-lean-crw-ds-dt"
ab n128a 128 512,1024,2048 "$L128,$N128,$S128"
ab n64a 64 512,1024,2048 "$L64,$N64,$S64"
ab n128b 128 512,1024,2048 "$S128,$N128,$L128"
ab n64b 64 512,1024,2048 "$S64,$N64,$L64"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
