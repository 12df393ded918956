#!/usr/bin/env bash
# NOTES §132: the persistent causal walk from a host-built table (hopper.walk_table, ab_fwd suffix
# "-wt"; "-wtall": one group of heads, the balance without the locality). GPU tests of the option
# first, then in-process A/Bs against the default walk (LPT / paired), cuDNN in the same process:
# d = 64 causal N = 512-4096 and d = 128 causal N = 512-8192, each twice with the order reversed.
# Usage: bash benchmarks/session_gpu_run173.sh OUT        (writes OUT/summary.log and OUT/run173.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run173.tar.gz" -C "$w" .; }
ab() {  # tag headdims causal seqlens loads timeout
    t0=$(date +%s)
    timeout "$6" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$? $(( $(date +%s) - t0 ))s"; grep -A8 "^  d c" "$w/$1.log"; grep -i "error\|fail" "$w/$1.log" | head -4
    pack
}
{
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "walk_table" > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
ab wt64_1 64 1 512,1024,2048,4096 gluon-pers-lean-ds,gluon-pers-lean-ds-wt,gluon-pers-lean-ds-wtall 110
ab wt128_1 128 1 512,1024,2048,4096,8192 gluon-pers-lean-crw-qr-ds,gluon-pers-lean-crw-qr-ds-wt,gluon-pers-lean-crw-qr-ds-wtall 130
ab wt64_2 64 1 512,1024,2048,4096 gluon-pers-lean-ds-wtall,gluon-pers-lean-ds-wt,gluon-pers-lean-ds 110
ab wt128_2 128 1 512,1024,2048,4096,8192 gluon-pers-lean-crw-qr-ds-wtall,gluon-pers-lean-crw-qr-ds-wt,gluon-pers-lean-crw-qr-ds 130
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
