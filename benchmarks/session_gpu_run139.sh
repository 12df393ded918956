#!/usr/bin/env bash
# NOTES §113, second run: (1) d = 64: the output's bulk copy with two Q buffers (run138's best), alone
# and with the tile index by multiply-high, against two Q buffers alone and the default; (2) d = 256:
# each option and both; (3) d = 128 at the lengths where the one-tile ping-pong kernel is the default
# (non-causal from 8192, causal 16384) against the persistent kernel with both options, for the policy.
# N = 512 ... 4096 (3: 8192 / 16384), both masks, 2 rounds.
# Usage: bash benchmarks/session_gpu_run139.sh OUT        (writes OUT/summary.log and OUT/run139.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run139.tar.gz" -C "$w" .; }
ab() {  # tag headdim loads timeout seqlens
    timeout "$4" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal 0,1 \
        --seqlens "$5" --loads "$3" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A10 "^  d c" "$w/$1.log"
    pack
}
{
p64=gluon-pers-lean
ab fwd64 64 $p64,$p64-q2,$p64-q2-tma,$p64-q2-tma-fd 150 512,1024,2048,4096
p256=gluon-pers-lean-crw-ds
ab fwd256 256 $p256,$p256-tma,$p256-fd,$p256-tma-fd 150 512,1024,2048,4096
ab fwd128long 128 gluon-pp-lean-crw-qr-ds,gluon-pers-lean-crw-qr-ds,gluon-pers-lean-crw-qr-ds-tma-fd 150 8192,16384
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
