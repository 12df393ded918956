#!/usr/bin/env bash
# NOTES §97: the persistent forward's consumer warpgroups free-running (hopper.persistent_turns off,
# ab_fwd's "-uo"): (1) ab_fwd with / without at d = 64 on its defaults (the persistent kernel's lengths);
# (2) its GPU tests; (3) d = 128. Each step packed as it ends, so a call cut short still returns what
# it finished. Usage: bash benchmarks/session_gpu_run114.sh OUT   (writes OUT/summary.log and OUT/run114.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run114.tar.gz" -C "$w" .; }
{
ab() {  # tag headdim causal seqlens loads timeout
    timeout "$6" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" \
        --seqlens "$4" --loads "$5" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A12 "^  d c" "$w/$1.log"
    pack
}
ab uo_64 64 0,1 512,1024 gluon-pers-lean,gluon-pers-lean-uo 70
timeout 70 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider -k "free_running" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8; pack
ab uo_128c 128 1 512,2048 gluon-pers-lean-crw-qr-ds,gluon-pers-lean-crw-qr-ds-uo 50
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
