#!/usr/bin/env bash
# NOTES §131: the deferred row sum as two chains over a thread's columns (hopper.row_sum_chains, ab_fwd
# suffix "-sc"), so that ptxas stops issuing the exponentials in back-to-back pairs. In-process A/Bs,
# cuDNN in the same process: d = 64 persistent both masks N = 512-2048 (twice, the order reversed),
# d = 128 causal N = 512 / 1024; then the option's GPU tests.
# Usage: bash benchmarks/session_gpu_run172.sh OUT        (writes OUT/summary.log and OUT/run172.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run172.tar.gz" -C "$w" .; }
ab() {  # tag headdims causal seqlens loads timeout
    t0=$(date +%s)
    timeout "$6" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$? $(( $(date +%s) - t0 ))s"; grep -A8 "^  d c" "$w/$1.log"; grep -i "error\|fail" "$w/$1.log" | head -4
    pack
}
{
ab sc64_1 64 0,1 512,1024,2048 gluon-pers-lean-ds,gluon-pers-lean-ds-sc 70
ab sc128_1 128 1 512,1024 gluon-pers-lean-crw-qr-ds,gluon-pers-lean-crw-qr-ds-sc 50
ab sc64_2 64 0,1 512,1024,2048 gluon-pers-lean-ds-sc,gluon-pers-lean-ds 60
t0=$(date +%s)
timeout 100 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "row_sum_chains" > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
