#!/usr/bin/env bash
# d = 64's masked ALiBi calls in wg3 with the split magic form (NOTES §151): (1) the ALiBi GPU tests, both masked
# forms forced at d = 64 and 128 (test_hopper_alibi_forward_forms); (2) the A/B at d = 64, causal and (4096, 0),
# N = 2048-16384: gluon-magic (wg3, magic) against gluon (pingpong, fp32 columns) and the portable forward.
# Usage: bash benchmarks/session_gpu_run219.sh OUT   (writes OUT/summary.log, OUT/tests.log, OUT/ab_window_fwd.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 170 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "hopper_alibi or hopper_varlen_alibi" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 80 python3 benchmarks/ab_window.py --pass fwd --alibi --out "$out" --headdims 64 \
    --seqlens 2048,4096,8192,16384 --windows=-1:0,4096:0 --providers gluon-magic,gluon,portable
echo "ab_window rc=$? $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$out/summary.log"
