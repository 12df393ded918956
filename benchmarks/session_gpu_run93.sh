#!/usr/bin/env bash
# Prepared for the next session (written 2026-12-02, fourteenth session): NOTES §83, the lean
# softmax's row max / sum as in-thread trees (hopper.tree_reductions, A/B suffix -tree). (1) its GPU
# tests (float64 oracle, gradients, lse against the chained form); (2) ab_fwd d = 64 both masks,
# N = 512-16384: the persistent kernel and wg3 with and without; (3) d = 128 / 256 non-causal and
# causal at 512 / 2048 / 16384: ping-pong and persistent with and without; cuDNN in the same runs.
# Usage: bash benchmarks/session_gpu_run93.sh OUT        (writes OUT/summary.log and OUT/run93.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 150 python3 -m pytest -q -x -n 12 tests/test_gpu.py -p no:cacheprovider -k "tree_reductions" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
timeout 200 python3 benchmarks/ab_fwd.py --out "$w" --tag tree_64 --headdims 64 --causal 0,1 \
    --seqlens 512,1024,2048,4096,16384 --loads gluon-pers-lean,gluon-pers-lean-tree,gluon-wg3,gluon-wg3-tree \
    --rounds 3 --rest 0.1 > "$w/tree_64.log" 2>&1
echo "tree_64 rc=$?"; grep -A12 "^  d c" "$w/tree_64.log"
timeout 200 python3 benchmarks/ab_fwd.py --out "$w" --tag tree_128_256 --headdims 128,256 --causal 0,1 \
    --seqlens 512,2048,16384 --loads gluon-pp-lean,gluon-pp-lean-tree,gluon-pers-lean,gluon-pers-lean-tree \
    --rounds 2 --rest 0.1 > "$w/tree_128_256.log" 2>&1
echo "tree_128_256 rc=$?"; grep -A14 "^  d c" "$w/tree_128_256.log"
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run93.tar.gz" -C "$w" . && rm -rf "$w"
