#!/usr/bin/env bash
# After NOTES §154's dispatch change (call checks and policies with the padded head dims, the plan):
# the GPU tests that go through the API's dispatch (default policies, deterministic mode, varlen, layouts,
# packed inputs, decode, the kernel choice the dispatch makes), at the final commit.
# Usage: bash benchmarks/session_gpu_run226.sh OUT   (writes OUT/summary.log, OUT/tests.log)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 420 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "through_the_api or default_dispatch or default_policy or test_deterministic or test_window_softcap_alibi or test_large_index or test_tma_forward or test_decode or hopper_layout_without_a_view or packed_inputs_without_copy or test_hopper_backward_varlen or test_hopper_forward_varlen" \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
} 2>&1 | tee "$out/summary.log"
