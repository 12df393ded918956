#!/usr/bin/env bash
# NOTES §108: does the persistent forward wait for K / V at every tile's start at short lengths (a new
# head's first key tiles, read from DRAM, loaded only STAGES ring uses ahead)? The ring's depth at
# d = 64 (the only head dim with shared memory to spare): 2 / 3 (default) / 4 / 6 slots, ab_fwd's
# "-sS", on the default options (gluon-pers-lean), N = 512 ... 4096, both masks, 2 rounds.
# Usage: bash benchmarks/session_gpu_run133.sh OUT        (writes OUT/summary.log and OUT/run133.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run133.tar.gz" -C "$w" .; }
{
timeout 240 python3 benchmarks/ab_fwd.py --out "$w" --tag ring64 --headdims 64 --causal 0,1 \
    --seqlens 512,1024,2048,4096 --loads gluon-pers-lean-s2,gluon-pers-lean,gluon-pers-lean-s4,gluon-pers-lean-s6 \
    --rounds 2 --rest 0.2 > "$w/ring64.log" 2>&1
echo "ab rc=$?"; grep -E "Error|error" "$w/ring64.log" | head -4; grep -A12 "^  d c" "$w/ring64.log"
pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
