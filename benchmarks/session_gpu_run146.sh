#!/usr/bin/env bash
# NOTES §115, the defaults as landed (the d = 64 persistent kernel with the deferred row sum and the
# no-key rows' 16-byte stores, hopper.NO_KEY_WIDE_HEADDIMS; d = 128 / 256 as before): the GPU tests of
# the persistent kernel (its tile loop with rows that see no key between tiles that do, rows past
# seqlen_q, one key tile a tile; its stores and index; the deferred row sum; the default dispatch).
# Usage: bash benchmarks/session_gpu_run146.sh OUT        (writes OUT/summary.log and OUT/run146.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run146.tar.gz" -C "$w" .; }
{
timeout 250 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "persistent_tile_loop or persistent_store_and_index or deferred_row_sum or default_dispatch_takes" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
