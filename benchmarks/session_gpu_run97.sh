#!/usr/bin/env bash
# First device call of the sixteenth session (2026-12-02), NOTES §86: 64-key tiles in the two- and
# three-warpgroup forwards (ab_fwd's new "-nBN-sS" suffix) and wg3 at head dim 128, each against its
# kernel's default tiles with the default options (conditional rescaling by the warp, "-crw", except
# the persistent kernel at d = 64), cuDNN in the same run; then the forward GPU tests at d = 64 / 128
# under §84's default (not rerun since), with what time is left.
# Usage: bash benchmarks/session_gpu_run97.sh OUT        (writes OUT/summary.log and OUT/run97.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run97.tar.gz" -C "$w" .; }
{
ab() {  # tag headdim loads timeout
    timeout "$4" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal 0,1 \
        --seqlens 512,2048,16384 --loads "$3" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A8 "^  d c" "$w/$1.log"
    pack
}
ab tiles_128 128 gluon-pp-lean-crw,gluon-pers-lean-crw,gluon-pp-lean-crw-n64-s4,gluon-pers-lean-crw-n64-s4,gluon-wg3-crw-n64-s4 170
ab tiles_64 64 gluon-pers-lean,gluon-wg3-crw,gluon-pers-lean-n64-s4,gluon-wg3-crw-n64-s6 130
ab tiles_256 256 gluon-pp-lean-crw,gluon-pers-lean-crw,gluon-pp-lean-crw-n32-s4,gluon-pers-lean-crw-n32-s4 130
timeout 120 python3 -m pytest -q -n 12 tests/test_gpu.py -p no:cacheprovider \
    -k "test_hopper_forward and not 256 and not exp2_fma and not conditional_rescale and not accumulator_stores and not lpt" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
