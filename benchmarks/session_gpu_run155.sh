#!/usr/bin/env bash
# NOTES §121's decision checked as the library runs it: (1) the GPU tests of the unmasked key loop, the
# persistent tile loop, its stores and the default dispatch (§120's switch removed); (2) the train
# sweep at head dims 128 and 64 (the README's rows for them), cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run155.sh OUT        (writes OUT/summary.log and OUT/run155.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run155.tar.gz" -C "$w" .; }
{
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "unmasked_keys or persistent_tile_loop or persistent_store_and_index or default_dispatch_takes" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
timeout 300 python3 -m ioattn bench train --headdims 128,64 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$?"
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " fwd " | head -n 30
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
