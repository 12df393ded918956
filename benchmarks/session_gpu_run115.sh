#!/usr/bin/env bash
# Prepared in the eighteenth session for the next one (NOTES §98): the persistent kernel at d = 64 with
# three consumer warpgroups (hopper.persistent_wg3, ab_fwd's "-w3"): (1) its GPU tests; (2) ab_fwd against
# the two-warpgroup persistent default ("gluon-pers-lean") and the one-tile wg3 at its defaults, with
# and without wg3's options on the three-warpgroup persistent build, non-causal and causal; (3) the
# paired causal walk at d = 64 against the LPT one, where §66 had it ahead. Each step
# packed as it ends, so a call cut short still returns what it finished.
# Usage: bash benchmarks/session_gpu_run115.sh OUT        (writes OUT/summary.log and OUT/run115.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run115.tar.gz" -C "$w" .; }
{
ab() {  # tag headdim causal seqlens loads timeout
    timeout "$6" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" \
        --seqlens "$4" --loads "$5" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A12 "^  d c" "$w/$1.log"
    pack
}
timeout 100 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider -k "persistent_wg3" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8; pack
ab p3_64 64 0 512,1024,2048 gluon-pers-lean,gluon-pers-lean-w3,gluon-pers-lean-crw-ds-w3,gluon-wg3-crw-ds 110
ab p3_64c 64 1 512,1024,2048,4096 gluon-pers-lean,gluon-pers-lean-w3,gluon-pers-lean-crw-w3,gluon-wg3-crw 130
# the two-warpgroup persistent kernel's causal walk by pairs at d = 64 again (hopper.PAIRED_HEADDIMS: off
# there since §66, where it was +1 / +4 / +2.5 % at N = 1024 / 2048 / 4096 and -18 % at 512)
ab pair_64c 64 1 1024,2048,4096 gluon-pers-lean,gluon-pers-lean-pair 70
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
