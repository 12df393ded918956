#!/usr/bin/env bash
# NOTES §160, the column split handing dQ's high half over first (WS_DQ_HI_FIRST): (1) ab_bwd at d =
# 256, hi first ("gluon-ws") against lo first ("gluon-ws-dqlofirst"), cuDNN in the same process; (2)
# ab_padded's backward at d = 192, the same pair; (3) the GPU tests of the column-split backward (hi
# first against lo first bitwise in the ordered mode, d = 256 / 192; the d = 256 backward's tests and
# forms; the padded path's). (compute-sanitizer: run241, if the order is kept.)
# Usage: bash benchmarks/session_gpu_run240.sh OUT   (writes OUT/summary.log, OUT/ab_bwd.*, OUT/ab_padded.*,
# OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 150 python3 benchmarks/ab_bwd.py --out "$out" --headdims 256 --seqlens 1024,4096,16384 --rounds 3 \
    --providers gluon-ws,gluon-ws-dqlofirst,sdpa-cudnn > "$out/ab_bwd.log" 2>&1
echo "ab_bwd rc=$? $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
timeout 150 python3 benchmarks/ab_padded.py --out "$out" --passes bwd --headdims 192 --rounds 3 \
    --seqlens 512,1024,4096,16384 --providers gluon-pad,gluon-pad-dqlofirst,sdpa-cudnn > "$out/ab_padded.log" 2>&1
echo "ab_padded rc=$? $(( $(date +%s) - t0 ))s"
grep -vE "^(fwd|bwd|pass) " "$out/ab_padded.log" | head -10
t0=$(date +%s)
# the column split's tests: d = 256 (the ordered mode at one configuration: its switches are d = 64 /
# 128's), the padded d = 192 (split and hi first at once), the forms at 256
tests="dq_hi_first or test_hopper_backward_d256 or (test_hopper_backward and 256-gluon-ws]) or (test_hopper_backward_deterministic and False-False-64 and 256]) or test_hopper_split_cols or (test_hopper_padded and 192) or (test_hopper_backward_window and 256) or (test_hopper_backward_softcap and 256) or (test_hopper_backward_varlen and 256)"
timeout 270 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "$tests" \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
tail -n 25 "$out/ab_bwd.log"
grep -E "^(fwd|bwd|pass) " "$out/ab_padded.log"
} 2>&1 | tee "$out/summary.log"
