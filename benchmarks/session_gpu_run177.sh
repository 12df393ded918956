#!/usr/bin/env bash
# NOTES §133 (the walk table's groups by head dim, the table at d = 64 from N = 512): (1) the train
# sweep at head dims 64, 128, 256 (the README's table), cuDNN in the same run; (2) the persistent
# kernel's GPU tests (the table's own, its CUDA-graph test, the tile loop's, the default dispatch's).
# Usage: bash benchmarks/session_gpu_run177.sh OUT        (writes OUT/summary.log and OUT/run177.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run177.tar.gz" -C "$w" .; }
{
t0=$(date +%s)  # 148 s in run175
timeout 260 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$? $(( $(date +%s) - t0 ))s"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " fwd " | head -n 40
pack
t0=$(date +%s)  # 88 s in run175
timeout 180 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "walk_table or persistent_tile_loop or default_dispatch" > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
