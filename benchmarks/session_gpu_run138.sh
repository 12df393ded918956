#!/usr/bin/env bash
# NOTES §113: the persistent forward's output by TMA (hopper.out_tma_store, ab_fwd "-tma") and its tile
# index by multiply-high (hopper.fast_tile_div, "-fd"): (1) their GPU tests (each option, both, one and
# two Q buffers; 8 workers); (2) ab_fwd on each head dim's default persistent options with each and
# both (d = 64: the copy with two Q buffers too), N = 512 / 1024 / 4096, both masks, 2 rounds.
# Usage: bash benchmarks/session_gpu_run138.sh OUT        (writes OUT/summary.log and OUT/run138.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run138.tar.gz" -C "$w" .; }
ab() {  # tag headdim loads timeout
    timeout "$4" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal 0,1 \
        --seqlens 512,1024,4096 --loads "$3" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A8 "^  d c" "$w/$1.log"
    pack
}
{
timeout 140 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "persistent_store_and_index" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
d128=gluon-pers-lean-crw-qr-ds
ab fwd128 128 $d128,$d128-tma,$d128-fd,$d128-tma-fd 170
ab fwd64 64 gluon-pers-lean,gluon-pers-lean-tma,gluon-pers-lean-q2-tma,gluon-pers-lean-fd,gluon-pers-lean-tma-fd 200
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
