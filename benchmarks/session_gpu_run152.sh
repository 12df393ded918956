#!/usr/bin/env bash
# NOTES §120 and §121. (1) The GPU tests of §121's unmasked key tiles (hopper.unmasked_full_keys).
# (2) §120, the one-tile kernels' output by TMA on d = 256's default one-tile build (the ping-pong
# kernel takes d = 256 from N = 8192 + 1 on: 16384 only), both masks. (3) §121: no key tile masked on
# non-causal calls whose key length is a multiple of the key tile, on each head dim's default build
# (d = 64: persistent to 1024, wg3 after; d = 128 / 256: persistent to 8192, ping-pong after), d = 64's
# persistent points twice, in two processes. ab_fwd, 3 interleaved rounds, cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run152.sh OUT        (writes OUT/summary.log and OUT/run152.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run152.tar.gz" -C "$w" .; }
ab() {  # tag headdim causal seqlens loads
    timeout 150 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A5 "^  d c" "$w/$1.log"
    pack
}
{
timeout 120 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "unmasked_keys" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
ab um64p 64 0 512,1024 "gluon-pers-lean-ds,gluon-pers-lean-ds-um"
ab ot256 256 0,1 16384 "gluon-pp-lean-crw-ds,gluon-pp-lean-crw-ds-tma"
ab um64w 64 0 2048,4096,16384 "gluon-wg3-crw-ds,gluon-wg3-crw-ds-um"
ab um128 128 0 512,1024,16384 "gluon-pers-lean-crw-qr-ds,gluon-pers-lean-crw-qr-ds-um,gluon-pp-lean-crw-qr-ds,gluon-pp-lean-crw-qr-ds-um"
ab um256 256 0 512,16384 "gluon-pers-lean-crw-ds,gluon-pers-lean-crw-ds-um,gluon-pp-lean-crw-ds,gluon-pp-lean-crw-ds-um"
ab um64p2 64 0 512,1024 "gluon-pers-lean-ds-um,gluon-pers-lean-ds"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
