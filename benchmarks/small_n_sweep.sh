#!/usr/bin/env bash
# Tile sweep at short sequences (N = 512, 1024), where the issue-2 run found ioattn below SDPA flash:
# do smaller tiles (more programs per SM, shorter prologues) win there? Usage: bash benchmarks/small_n_sweep.sh OUTDIR
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
T=benchmarks/tune_tiles.py
timeout 50 python3 $T --out "$out/f128" --kinds fwd --headdims 128 --seqlens 512,1024 \
    --candidates "128,64,8,3;64,64,4,3;64,128,4,3;64,32,4,3" > "$out/f128.log" 2>&1
timeout 40 python3 $T --out "$out/f64" --kinds fwd --headdims 64 --seqlens 512,1024 \
    --candidates "128,64,4,3;64,64,4,3;64,32,4,3;64,128,4,2" > "$out/f64.log" 2>&1
timeout 55 python3 $T --out "$out/b64" --kinds bwd --headdims 64 --seqlens 512,1024 \
    --candidates "64,64,4,2;32,64,4,2;64,32,4,2;32,32,4,2" > "$out/b64.log" 2>&1
for f in "$out"/*.log; do sed -n '/best per/,$p' "$f"; done
