#!/usr/bin/env bash
# NOTES §119: FA4's exp2 on the FMA units in the persistent kernel at the short lengths below cuDNN
# (§42-§43 measured it only on wg3 and the one-tile ping-pong at N >= 4096). ab_fwd, 3 interleaved
# rounds, each head dim's default persistent options with 0 / 12.5 / 25 / 50 % of each key tile's
# exponentials on the FMA units, cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run150.sh OUT        (writes OUT/summary.log and OUT/run150.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run150.tar.gz" -C "$w" .; }
ab() {  # tag headdim causal seqlens loads
    timeout 150 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A8 "^  d c" "$w/$1.log"
    pack
}
{
d=gluon-pers-lean
ab fma64 64 0,1 512,1024,2048 "$d-ds,$d-fma12-ds,$d-fma25-ds,$d-fma50-ds"
d=gluon-pers-lean-fma12-crw-qr-ds
ab fma128 128 1 512,1024 "gluon-pers-lean-crw-qr-ds,gluon-pers-lean-fma12-crw-qr-ds,gluon-pers-lean-fma25-crw-qr-ds"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
