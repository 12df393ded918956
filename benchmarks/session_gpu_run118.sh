#!/usr/bin/env bash
# Nineteenth session (NOTES §99, second run): the flat dQ tile with its reorder pass as a Triton kernel
# (dq_from_blocks_kernel; run117 reordered with a torch copy through a 16-dimensional view, slow at short N).
# (1) its GPU tests (float64 oracle, every shape of the backward suite; the deterministic mode);
# (2) ab_bwd against the swizzled tile (the default) and cuDNN, d = 64 / 128, 3 rounds;
# Usage: bash benchmarks/session_gpu_run118.sh OUT        (OUT/summary.log, OUT/run118.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run118.tar.gz" -C "$w" .; }
{
timeout 170 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider -k "flat" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8; pack
timeout 250 python3 benchmarks/ab_bwd.py --out "$w" --tag flat --headdims 128,64 --seqlens 1024,4096,16384 \
    --providers gluon-ws,gluon-ws-dqflat,sdpa-cudnn --rounds 3 > "$w/flat.log" 2>&1
echo "ab rc=$?"; grep -E "Error|error|FAIL" "$w/flat.log" | head -4; grep -A14 "^  d c" "$w/flat.log"; pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
