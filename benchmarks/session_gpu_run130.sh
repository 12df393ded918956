#!/usr/bin/env bash
# The twentieth session's closing check: the Gluon backward's GPU suite with the committed defaults (dO
# released with the dQ block, §102; a partition a consumer warpgroup at d = 128, §105): every variant and
# head dim, both forwards, masks and dtypes, the ordered dQ mode (its split-partition form too), the backward through
# the API; 6 workers (the largest shape's float64 oracle runs out of memory with more).
# Usage: bash benchmarks/session_gpu_run130.sh OUT        (writes OUT/summary.log and OUT/run130.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run130.tar.gz" -C "$w" .; }
{
timeout 270 python3 -m pytest -q -n 6 tests/test_gpu.py -p no:cacheprovider \
    -k "(test_hopper_backward and not ws-) or backward_through_the_api or deterministic" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
