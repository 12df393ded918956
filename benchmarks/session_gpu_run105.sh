#!/usr/bin/env bash
# Sixth device call of the seventeenth session (2026-12-02), NOTES §92: one release a K / V slot
# (hopper.one_release, ab_fwd's "-kv1"): (1) its GPU tests; (2) ab_fwd with / without it in wg3 at
# d = 64 (the default there from N = 2048 non-causal, 8192 causal) and in the persistent kernel at
# d = 64 over its policy range, the session's defaults otherwise (the deferred row sum in wg3
# non-causal, "-ds").
# Usage: bash benchmarks/session_gpu_run105.sh OUT        (writes OUT/summary.log and OUT/run105.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run105.tar.gz" -C "$w" .; }
{
timeout 130 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider -k "one_release" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8; pack
ab() {  # tag headdim causal seqlens loads timeout
    timeout "$6" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" \
        --seqlens "$4" --loads "$5" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A12 "^  d c" "$w/$1.log"
    pack
}
ab kv1_64w 64 0 2048,4096,8192,16384 gluon-wg3-crw-ds,gluon-wg3-crw-ds-kv1 110
ab kv1_64wc 64 1 8192,16384 gluon-wg3-crw,gluon-wg3-crw-kv1 80
ab kv1_64p 64 0,1 512,1024,2048,4096 gluon-pers-lean,gluon-pers-lean-kv1 120
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
