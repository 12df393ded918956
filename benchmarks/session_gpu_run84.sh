#!/usr/bin/env bash
# Prepared for the next session (written 2026-12-02, thirteenth session): NOTES §75, wg3 made
# persistent. (1) its GPU tests: every forward test that takes a variant, the persistent tile loop with
# each option; (2) ab_fwd d = 64, both masks, wg3 / the two-warpgroup persistent kernel / persistent
# wg3 with one and with two Q buffers a warpgroup (-q2), cuDNN in the same run; (3) NOTES §76, decode
# batch 64 x 4096 with a forced tail split (ab_decode --cases tail64).
# Usage: bash benchmarks/session_gpu_run84.sh OUT        (writes OUT/summary.log and OUT/run84.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 170 python3 -m pytest -q -x -n 12 tests/test_gpu.py -p no:cacheprovider \
    -k "persistent-wg3 or (persistent_tile_loop and 64)" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
timeout 260 python3 benchmarks/ab_fwd.py --out "$w" --tag pers3_64 --headdims 64 --causal 0,1 \
    --seqlens 512,1024,2048,4096,16384 --loads gluon-wg3,gluon-pers-lean,gluon-pers3,gluon-pers3-q2 \
    --rounds 3 --rest 0.1 \
    > "$w/pers3_64.log" 2>&1
echo "pers3_64 rc=$?"; grep -A12 "^  d c" "$w/pers3_64.log"
timeout 120 python3 benchmarks/ab_decode.py --out "$w" --cases tail64 --rounds 3 > "$w/tail64.log" 2>&1
echo "tail64 rc=$?"; sed -n '/median over rounds/,$p' "$w/tail64.log"
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run84.tar.gz" -C "$w" . && rm -rf "$w"
