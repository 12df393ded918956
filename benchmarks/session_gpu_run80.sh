#!/usr/bin/env bash
# Thirteenth session, third call: NOTES §71, the persistent forward's stream-K last wave. (1) its GPU
# tests and the persistent tile loop's and default dispatch's (the walk now goes through _unit);
# (2) ab_fwd, non-causal, persistent with / without it, the ping-pong kernel and cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run80.sh OUT        (writes OUT/summary.log and OUT/run80.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 170 python3 -m pytest -q -x -n 12 tests/test_gpu.py -p no:cacheprovider \
    -k "stream_k or persistent_tile_loop or default_dispatch" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
ab() {  # tag headdim seqlens timeout
    timeout "$4" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal 0 --seqlens "$3" \
        --loads gluon-pp-lean,gluon-pers-lean,gluon-pers-lean-sk --rounds 3 --rest 0.1 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -A8 "^  d c" "$w/$1.log"
}
ab sk_128 128 512,1024,2048,4096,16384 170
ab sk_256 256 512,1024,2048,4096,16384 170
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run80.tar.gz" -C "$w" . && rm -rf "$w"
