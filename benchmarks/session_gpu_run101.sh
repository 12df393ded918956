#!/usr/bin/env bash
# Prepared in the sixteenth session for the next one, NOTES §89: the row sum's quad reduction once a
# tile (hopper.deferred_row_sum, ab_fwd's "-ds"): (1) its GPU tests; (2) ab_fwd with / without in the
# two-warpgroup kernels at each head dim, the defaults otherwise (conditional rescaling by the warp,
# "-crw", but the persistent kernel at d = 64; Q in registers, "-qr", at d = 128), cuDNN in the run.
# Usage: bash benchmarks/session_gpu_run101.sh OUT        (writes OUT/summary.log and OUT/run101.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run101.tar.gz" -C "$w" .; }
{
timeout 150 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider -k "deferred_row_sum" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8; pack
ab() {  # tag headdim loads timeout
    timeout "$4" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal 0,1 \
        --seqlens 512,2048,16384 --loads "$3" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A8 "^  d c" "$w/$1.log"
    pack
}
ab ds_128 128 gluon-pp-lean-crw-qr,gluon-pp-lean-crw-qr-ds,gluon-pers-lean-crw-qr,gluon-pers-lean-crw-qr-ds 130
ab ds_64 64 gluon-pers-lean,gluon-pers-lean-ds,gluon-wg3-crw 120
ab ds_256 256 gluon-pp-lean-crw,gluon-pp-lean-crw-ds,gluon-pers-lean-crw,gluon-pers-lean-crw-ds 130
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
