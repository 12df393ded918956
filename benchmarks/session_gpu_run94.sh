#!/usr/bin/env bash
# Second device call of the fifteenth session (2026-12-02), NOTES §84: conditional rescaling decided
# by the thread (run 93) or by the warp (one vote, a uniform branch). (1) its GPU tests, both forms;
# (2) the gradient errors on climbing scores with and without it (run 93's one failure); (3) ab_fwd,
# without / by thread / by warp, at each head dim, both masks, cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run94.sh OUT        (writes OUT/summary.log and OUT/run94.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 200 python3 -m pytest -q -n 12 tests/test_gpu.py -p no:cacheprovider -k "conditional_rescale" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
timeout 60 python3 benchmarks/diag_ramp_grads.py > "$w/diag_ramp_grads.log" 2>&1
echo "diag rc=$?"; cut -c1-200 "$w/diag_ramp_grads.log"
ab() {  # tag headdim loads timeout
    timeout "$4" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal 0,1 \
        --seqlens 512,2048,16384 --loads "$3" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -A8 "^  d c" "$w/$1.log"
}
ab crw_256 256 gluon-pers-lean,gluon-pers-lean-cr,gluon-pers-lean-crw,gluon-pp-lean,gluon-pp-lean-cr,gluon-pp-lean-crw 110
ab crw_128 128 gluon-pers-lean,gluon-pers-lean-crw,gluon-pp-lean,gluon-pp-lean-cr,gluon-pp-lean-crw 110
ab crw_64 64 gluon-pers-lean,gluon-pers-lean-cr,gluon-pers-lean-crw,gluon-wg3,gluon-wg3-crw 110
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run94.tar.gz" -C "$w" . && rm -rf "$w"
