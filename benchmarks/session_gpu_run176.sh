#!/usr/bin/env bash
# Prepared for the next device session (NOTES §132's plan): (1) the walk table's CUDA-graph test (a
# shape first seen inside a capture takes the computed walk); (2) the table's group budget by head
# dim, two processes with the order reversed: d = 64 causal N = 512-2048 at 2 / 4 / 16 MB against the
# default (the computed LPT walk at 512), d = 128 causal N = 512-2048 at 4 / 16 / 32 MB.
# Usage: bash benchmarks/session_gpu_run176.sh OUT        (writes OUT/summary.log and OUT/run176.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run176.tar.gz" -C "$w" .; }
ab() {  # tag headdim loads (each ~25 s in run175)
    t0=$(date +%s)
    timeout 60 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal 1 --seqlens 512,1024,2048 \
        --loads "$3" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$? $(( $(date +%s) - t0 ))s"; grep -A4 "^  d c" "$w/$1.log"; grep -i "error\|fail" "$w/$1.log" | head -4
    pack
}
{
t0=$(date +%s)
timeout 90 python3 -m pytest -q tests/test_gpu.py -p no:cacheprovider -k "walk_table_cuda_graph" > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -4
pack
b64=gluon-pers-lean-ds; b128=gluon-pers-lean-crw-qr-ds  # each head dim's default build
ab g64_1 64 $b64,$b64-wt-wtg2,$b64-wt-wtg4,$b64-wt-wtg16
ab g128_1 128 $b128-wt-wtg4,$b128-wt-wtg16,$b128-wt-wtg32
ab g64_2 64 $b64-wt-wtg16,$b64-wt-wtg4,$b64-wt-wtg2,$b64
ab g128_2 128 $b128-wt-wtg32,$b128-wt-wtg16,$b128-wt-wtg4
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
