#!/usr/bin/env bash
# NOTES §120 (to run first in the next session): the one-tile ping-pong kernels' output copied by TMA
# from the dead Q buffer (hopper.one_tile_tma_store, ROW_STORES = 3, off by default), where a first
# look gained (+2.4 % at d = 256, 16384, on a build with Q in registers); at d = 64 (wg3) it was level.
# (1) its GPU tests; (2) ab_fwd at d = 256, the default options (conditional rescaling, deferred sum;
# the mask branch causal) and the same with Q in registers, each with and without the copy, both
# masks, N = 8192 / 16384 (the persistent kernel takes d = 256 up to 8192: 8192 compares the one-tile
# kernel only); 3 interleaved rounds, cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run151.sh OUT        (writes OUT/summary.log and OUT/run151.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run151.tar.gz" -C "$w" .; }
ab() {  # tag headdim causal seqlens loads
    timeout 240 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A5 "^  d c" "$w/$1.log"
    pack
}
{
timeout 150 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "one_tile_tma_store" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
ab ot256 256 0,1 8192,16384 "gluon-pp-lean-crw-ds,gluon-pp-lean-crw-ds-tma,gluon-pp-lean-crw-qr-ds,gluon-pp-lean-crw-qr-ds-tma"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
