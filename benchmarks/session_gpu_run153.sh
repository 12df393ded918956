#!/usr/bin/env bash
# NOTES §121, second run: run152 found the unmasked key tiles +5 % at d = 64 N = 512 (persistent,
# twice) and +3 % at d = 128 N = 512, but -4.6 % at d = 128 N = 16384 (ping-pong and persistent) and
# -2 % for wg3 at 16384. Where in the persistent kernel's default range (d = 128 / 256 to N = 8192) the
# sign turns, and wg3 at d = 64 again (a second process, the unmasked build first). ab_fwd, 3
# interleaved rounds, cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run153.sh OUT        (writes OUT/summary.log and OUT/run153.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run153.tar.gz" -C "$w" .; }
ab() {  # tag headdim causal seqlens loads
    timeout 150 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A6 "^  d c" "$w/$1.log"
    pack
}
{
ab um128p 128 0 512,1024,2048,4096,8192 "gluon-pers-lean-crw-qr-ds-um,gluon-pers-lean-crw-qr-ds"
ab um256p 256 0 1024,2048,4096,8192 "gluon-pers-lean-crw-ds,gluon-pers-lean-crw-ds-um"
ab um64w2 64 0 2048,4096,16384 "gluon-wg3-crw-ds-um,gluon-wg3-crw-ds"
ab um64p3 64 0 512,1024 "gluon-pers-lean-ds,gluon-pers-lean-ds-um"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
