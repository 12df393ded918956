#!/usr/bin/env bash
# Device call D of 2026-12-02 (tenth session): (1) NOTES §59, d = 256's dQ high half staged in the
# step's Q slot (WS_DQ_HI_VIA_Q, off): its GPU tests (every shape / mask / dtype of test_hopper_backward,
# both forwards feeding, and the deterministic mode) and the A/B against the default, cuDNN in the same
# run; (2) the Gluon forward tests with the new store defaults (calls B and C ran out of time before
# the end: here 16 workers and -v, so every finished test is named in the log).
# Its first run (2026-12-02) hung in (1): the high half announced on dq_full (NOTES §59); the script as
# it stands is the next session's first call, with longer limits for (1); (2) passed then.
# Usage: bash benchmarks/session_gpu_run63.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 -m pytest tests/test_gpu.py -k "dqhi and 256" -n 16 -v -p no:cacheprovider -rfE \
    > "$out/test_gpu_dqhi.log" 2>&1
echo "tests dqhi rc=$?"; tail -n 1 "$out/test_gpu_dqhi.log"; grep -E " FAILED | ERROR " "$out/test_gpu_dqhi.log" | head -n 5
timeout 150 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_dqhi --headdims 256 --seqlens 1024,4096,16384 \
    --rounds 3 --providers gluon-ws,gluon-ws-dqhi,sdpa-cudnn > "$out/ab_bwd_dqhi.log" 2>&1
echo "ab dqhi rc=$?"; grep -A7 "^  d c" "$out/ab_bwd_dqhi.log"
timeout 250 python3 -m pytest tests/test_gpu.py -n 16 -v -p no:cacheprovider -rfE \
    -k "hopper_forward and not accumulator_stores or default_dispatch or d256_through_the_api" \
    > "$out/test_gpu_fwd.log" 2>&1
echo "tests fwd rc=$?"; grep -cE " PASSED " "$out/test_gpu_fwd.log"; grep -cE " SKIPPED " "$out/test_gpu_fwd.log"
grep -E " FAILED | ERROR " "$out/test_gpu_fwd.log" | head -n 5; tail -n 1 "$out/test_gpu_fwd.log"
