#!/usr/bin/env bash
# NOTES §117: the persistent kernel's options re-measured at the short points still below cuDNN, on
# today's defaults (the walk by pairs, the second Q buffer, Q in registers, conditional rescaling, the
# mask branch and the deferred row sum were each decided on older builds: §66, §98, §103, §114), with
# the one-tile ping-pong kernel beside them; ab_fwd, 3 interleaved rounds, cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run148.sh OUT        (writes OUT/summary.log and OUT/run148.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run148.tar.gz" -C "$w" .; }
ab() {  # tag headdim causal seqlens loads
    timeout 170 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A4 "^  d c" "$w/$1.log"
    pack
}
{
d=gluon-pers-lean-crw
ab c128 128 1 512,1024 "$d-qr-ds,$d-nopair-qr-ds,$d-noq2-qr-ds,$d-ds,gluon-pers-lean-qr-ds,$d-qr-ds-nomb,$d-qr,gluon-pp-lean-crw-qr-ds"
ab c256 256 1 512 "$d-ds,$d-nopair-ds,gluon-pers-lean-ds,$d-ds-nomb,$d,gluon-pp-lean-crw-ds"
d=gluon-pers-lean
ab c64 64 1 512,1024,2048 "$d-ds,$d-noq2-ds,$d-pair-ds,$d-qr-ds,$d-ds-mb"
ab n64 64 0 512,1024,2048 "$d-ds,$d-noq2-ds,$d-qr-ds,gluon-wg3-crw-ds"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
