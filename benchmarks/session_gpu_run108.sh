#!/usr/bin/env bash
# NOTES §93: the row max over a thread's columns as a tree (hopper.max_tree, ab_fwd's "-mt"): (1) its
# GPU tests (after the d = 256 A/B: its output is checked by the script); (2) ab_fwd with / without
# it at d = 256 and d = 128 on the session's defaults (the row sum
# deferred, "-ds"; Q in registers at d = 128, "-qr"); (3) wg3 at d = 64. Each step packed as it ends,
# so a call cut short still returns what it finished.
# Usage: bash benchmarks/session_gpu_run108.sh OUT        (writes OUT/summary.log and OUT/run108.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run108.tar.gz" -C "$w" .; }
{
ab() {  # tag headdim causal seqlens loads timeout
    timeout "$6" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" \
        --seqlens "$4" --loads "$5" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A12 "^  d c" "$w/$1.log"
    pack
}
ab mt_256 256 0,1 2048,16384 gluon-pp-lean-crw-ds,gluon-pp-lean-crw-ds-mt 70
timeout 80 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider -k "max_tree" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8; pack
ab mt_128 128 0,1 2048,16384 gluon-pp-lean-crw-qr-ds,gluon-pp-lean-crw-qr-ds-mt 60
ab mt_64 64 0 2048,16384 gluon-wg3-crw-ds,gluon-wg3-crw-ds-mt 50
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
