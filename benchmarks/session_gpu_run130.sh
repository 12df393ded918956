#!/usr/bin/env bash
# The twentieth session's closing check: the Gluon backward's GPU suite with the committed defaults (dO
# released with the dQ block, §102; a partition a consumer warpgroup at d = 128, §105) where they changed:
# d = 128 (the "ws" and "base" variants, both forwards, masks and dtypes; the ordered dQ mode, its
# split-partition form too) and the backward through the API at every head dim; 6 workers (the largest
# shape's float64 oracle runs out of memory with more). Sized for the device time left (~150 s).
# Usage: bash benchmarks/session_gpu_run130.sh OUT        (writes OUT/summary.log and OUT/run130.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run130.tar.gz" -C "$w" .; }
{
timeout 150 python3 -m pytest -q -n 6 tests/test_gpu.py -p no:cacheprovider \
    -k "(test_hopper_backward and not ws- and 128) or backward_through_the_api or (test_hopper_backward_deterministic and 128)" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
