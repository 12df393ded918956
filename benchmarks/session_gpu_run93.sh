#!/usr/bin/env bash
# First device call of the fifteenth session (2026-12-02), NOTES §84: FA4's conditional rescaling in
# the Gluon forward (hopper.conditional_rescale, the kernel's LEAN bit 1). (1) its GPU tests (float64
# oracle on random and climbing scores, extreme logits, fp16; the lse against the default kernel's);
# (2) ab_fwd with / without it, the persistent and the long-sequence default variant at each head
# dim, both masks, cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run93.sh OUT        (writes OUT/summary.log and OUT/run93.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 170 python3 -m pytest -q -x -n 12 tests/test_gpu.py -p no:cacheprovider -k "conditional_rescale" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)|Error" "$w/tests.log" | head -5
ab() {  # tag headdim loads timeout
    timeout "$4" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal 0,1 \
        --seqlens 512,2048,16384 --loads "$3" --rounds 2 --rest 0.1 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -A8 "^  d c" "$w/$1.log"
}
ab cr_128 128 gluon-pers-lean,gluon-pers-lean-cr,gluon-pp-lean,gluon-pp-lean-cr 130
ab cr_256 256 gluon-pers-lean,gluon-pers-lean-cr,gluon-pp-lean,gluon-pp-lean-cr 130
ab cr_64 64 gluon-pers-lean,gluon-pers-lean-cr,gluon-wg3,gluon-wg3-cr 130
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run93.tar.gz" -C "$w" . && rm -rf "$w"
