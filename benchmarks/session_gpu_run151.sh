#!/usr/bin/env bash
# NOTES §120 (prepared in the twenty-fourth session, to run first in the next): the one-tile ping-pong
# kernels' output copied by TMA from the dead Q buffer (hopper.one_tile_tma_store, ROW_STORES = 3, off
# by default). (1) its GPU tests; (2) ab_fwd, each kernel's default options with and without it where
# the one-tile kernels are the default: wg3 at d = 64 (non-causal from 2048, causal from 8192), the
# ping-pong kernel at d = 128 and 256 at 16384; 3 interleaved rounds, cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run151.sh OUT        (writes OUT/summary.log and OUT/run151.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run151.tar.gz" -C "$w" .; }
ab() {  # tag headdim causal seqlens loads
    timeout 120 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A5 "^  d c" "$w/$1.log"
    pack
}
{
timeout 150 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "one_tile_tma_store" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
ab ot64 64 0 2048,4096,16384 "gluon-wg3-crw-ds,gluon-wg3-crw-ds-tma"
ab ot64c 64 1 8192,16384 "gluon-wg3-crw,gluon-wg3-crw-tma"
ab ot128 128 0,1 16384 "gluon-pp-lean-crw-qr-ds,gluon-pp-lean-crw-qr-ds-tma"
ab ot256 256 0,1 16384 "gluon-pp-lean-crw-ds,gluon-pp-lean-crw-ds-tma"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
