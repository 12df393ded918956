#!/usr/bin/env bash
# NOTES §121 follow-up: with the unmasked key loop, does the persistent kernel now beat wg3 at d = 64
# non-causal past its range (N = 1024 ... 4096; wg3 is the default from 2048, at 0.99x cuDNN)? And
# d = 256's persistent kernel with / without it a second time (+0.5 to +1.3 % in one run). ab_fwd, 3
# interleaved rounds, cuDNN in the same process.
# Usage: bash benchmarks/session_gpu_run156.sh OUT        (writes OUT/summary.log and OUT/run156.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run156.tar.gz" -C "$w" .; }
ab() {  # tag headdim causal seqlens loads
    timeout 130 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A4 "^  d c" "$w/$1.log"
    pack
}
{
ab pw64 64 0 1024,2048,4096 "gluon-pers-lean-ds-um,gluon-pers-lean-ds,gluon-wg3-crw-ds"
ab um256 256 0 512,2048 "gluon-pers-lean-crw-ds-um,gluon-pers-lean-crw-ds"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
