#!/usr/bin/env bash
# Fourth device call of the twelfth session (2026-12-02): NOTES §68, the forward epilogue's
# normalisation by one reciprocal a row (the default now) against the division an element (-div,
# hopper.epilogue_division). (1) GPU tests of the default dispatch, the ping-pong and wg3 forwards and
# the Q-staged row stores; (2) ab_fwd, 2 interleaved rounds with rest, cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run76.sh OUT        (writes OUT/summary.log and OUT/run76.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 200 python3 -m pytest -q -x -n 12 tests/test_gpu.py -p no:cacheprovider \
    -k "default_dispatch or test_hopper_forward_row_stores_via_q or (test_hopper_forward[ and (wg3 or pingpong))" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
ab() {  # tag headdim causal seqlens loads
    timeout 150 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 2 --rest 0.1 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -A8 "^  d c" "$w/$1.log"
}
ab ab_div_128 128 0 512,1024,16384 gluon-pers-lean,gluon-pers-lean-div,gluon-pp-lean,gluon-pp-lean-div
ab ab_div_128c 128 1 512,2048 gluon-pers-lean,gluon-pers-lean-div
ab ab_div_64 64 0 512 gluon-pers-lean,gluon-pers-lean-div
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run76.tar.gz" -C "$w" . && rm -rf "$w"
