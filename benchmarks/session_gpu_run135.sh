#!/usr/bin/env bash
# NOTES §110: the persistent forward's tiles chained (hopper.persistent_chain, ab_fwd's "-ch"): (1) the
# persistent tile-loop GPU tests (every option combination, the chain's among them: several tiles a
# program, tiles with no visible key between tiles that do, one key tile a tile; 8 workers); (2) ab_fwd
# with / without on each head dim's default persistent options (d = 64: also two Q buffers alone, which
# the chain brings), N = 512 ... 4096, both masks, 2 rounds. Each step packed as it ends.
# Usage: bash benchmarks/session_gpu_run135.sh OUT        (writes OUT/summary.log and OUT/run135.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run135.tar.gz" -C "$w" .; }
ab() {  # tag headdim loads timeout
    timeout "$4" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal 0,1 \
        --seqlens 512,1024,2048,4096 --loads "$3" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A10 "^  d c" "$w/$1.log"
    pack
}
{
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "persistent_tile_loop" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
ab chain128 128 gluon-pers-lean-crw-qr-ds,gluon-pers-lean-crw-qr-ds-ch 130
ab chain64 64 gluon-pers-lean,gluon-pers-lean-q2,gluon-pers-lean-ch 130
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
