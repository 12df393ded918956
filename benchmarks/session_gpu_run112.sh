#!/usr/bin/env bash
# NOTES §95: the mask alone under its branch ahead of one softmax body at a tile's first key step only
# (hopper.mask_branch, ab_fwd's "-mb"): (1) its GPU tests; (2) ab_fwd with / without it on each kernel's
# default options, where each kernel is the default (persistent at short lengths, ping-pong at long ones;
# wg3's code does not change). Each step packed
# as it ends, so a call cut short still returns what it finished.
# Usage: bash benchmarks/session_gpu_run112.sh OUT        (writes OUT/summary.log and OUT/run112.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run112.tar.gz" -C "$w" .; }
{
ab() {  # tag headdim causal seqlens loads timeout
    timeout "$6" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" \
        --seqlens "$4" --loads "$5" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A12 "^  d c" "$w/$1.log"
    pack
}
ab mb_128p 128 0,1 512,1024,2048 gluon-pers-lean-crw-qr-ds,gluon-pers-lean-crw-qr-ds-mb 100
timeout 100 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider -k "mask_branch" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8; pack
ab mb_64p 64 0,1 512,1024 gluon-pers-lean,gluon-pers-lean-mb 70
ab mb_256p 256 0,1 512,2048 gluon-pers-lean-crw-ds,gluon-pers-lean-crw-ds-mb 70
ab mb_128pp 128 0,1 16384 gluon-pp-lean-crw-qr-ds,gluon-pp-lean-crw-qr-ds-mb 50
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
