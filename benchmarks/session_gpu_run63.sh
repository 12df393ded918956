#!/usr/bin/env bash
# First device call of the next session (written 2026-12-02, tenth session): (1) NOTES §59, d = 256's dQ
# high half staged in the step's Q slot (WS_DQ_HI_VIA_Q, off): its GPU tests (every shape / mask /
# dtype of test_hopper_backward, both forwards feeding, and the deterministic mode), -v, and the A/B
# against the default, cuDNN in the same run; (2) compute-sanitizer memcheck and racecheck on one small
# call of each kernel family (benchmarks/sanitize_small.py), which the whole-row store paths made
# default this session (the forward's output, d = 256's dK / dV through the Q ring) have not met.
# This script's first form (2026-12-02) hung in (1): the high half was announced on dq_full (NOTES §59,
# fixed since); its forward-test part passed then (results/session-2026-12-02-j) and is gone.
# Usage: bash benchmarks/session_gpu_run63.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 -m pytest tests/test_gpu.py -k "dqhi and 256" -n 16 -v -p no:cacheprovider -rfE \
    > "$out/test_gpu_dqhi.log" 2>&1
echo "tests dqhi rc=$?"; grep -c " PASSED " "$out/test_gpu_dqhi.log"; tail -n 1 "$out/test_gpu_dqhi.log"
grep -E " FAILED | ERROR " "$out/test_gpu_dqhi.log" | head -n 5
timeout 150 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_dqhi --headdims 256 --seqlens 1024,4096,16384 \
    --rounds 3 --providers gluon-ws,gluon-ws-dqhi,sdpa-cudnn > "$out/ab_bwd_dqhi.log" 2>&1
echo "ab dqhi rc=$?"; grep -A7 "^  d c" "$out/ab_bwd_dqhi.log"
for tool in memcheck racecheck; do
    timeout 110 compute-sanitizer --tool $tool python3 benchmarks/sanitize_small.py > "$out/sanitizer_$tool.log" 2>&1
    echo "sanitizer $tool rc=$?"; tail -n 2 "$out/sanitizer_$tool.log"
done
grep -h -o "in [a-z_0-9]*kernel[a-z_0-9]*" "$out"/sanitizer_*.log | sort | uniq -c | sort -rn | head -n 8
