#!/usr/bin/env bash
# NOTES §143, after run193 / run194: (1) ab_varlen --pass bwd at the short means 128 / 256 (max_seqlen
# about 220 / 440: where BWD_VARLEN_AUTO_MIN_SEQLEN starts), every head dim, SDPA's kernels named; (2) the
# fixed-length ws backward's GPU tests (its plain build with the Gluon forward, bf16 (dtype0), the suite's shapes;
# the ordered mode's tests; the API's deterministic and default-policy tests): the IS_VARLEN change left
# the fixed-length kernels' PTX counts unchanged, this runs them.
# Usage: bash benchmarks/session_gpu_run195.sh OUT        (writes OUT/summary.log, OUT/tests.log, OUT/ab_varlen_bwd.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)  # run194: 24 points x 3 providers in 100 s
timeout 200 python3 benchmarks/ab_varlen.py --pass bwd --out "$out" --headdims 64,128,256 --means 128,256 \
    > "$out/ab_varlen_bwd.log" 2>&1
echo "ab_varlen bwd rc=$? $(( $(date +%s) - t0 ))s"
grep -v -i warn "$out/ab_varlen_bwd.log" | tail -16
t0=$(date +%s)
timeout 330 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "(test_hopper_backward and gluon and dtype0 and ws and not swizzled and not lse and not wgsplit and not lockstep and not varlen) or test_hopper_backward_deterministic or test_deterministic_through or test_backward_default_policy" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
python3 -c "
import json
for l in open('$out/ab_varlen_bwd.jsonl'):
    r = json.loads(l)
    if r['provider'] == 'sdpa-njt': print(r['headdim'], r['causal'], r['mean'], r.get('kernel', r.get('error'))[:200])
" | head -4
} 2>&1 | tee "$out/summary.log"
