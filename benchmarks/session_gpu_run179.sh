#!/usr/bin/env bash
# After NOTES §133 (the table at d = 64 from N = 512, groups by head dim): the forward's GPU tests as the
# library runs them now (every variant's bf16 shapes, the persistent tile loop, the diagonal trim, the
# mask branch, the unmasked keys, the walk table, the default dispatch) and the backward through the API.
# Usage: bash benchmarks/session_gpu_run179.sh OUT        (writes OUT/summary.log and OUT/run179.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run179.tar.gz" -C "$w" .; }
{
t0=$(date +%s)  # run169's selection without the last two: 177 s
timeout 330 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "(hopper_forward and dtype0 and not varlen \
and not extreme and not exp2 and not registers) or persistent_tile_loop or diag_trim or default_dispatch or mask_branch \
or unmasked_keys or walk_table or backward_through_the_api" > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
