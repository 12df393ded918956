#!/usr/bin/env bash
# NOTES §99-§100: after the flat dQ tile became the backward's default at d = 64 / 128 (and the paired
# causal walk the persistent forward's at d = 64 from N = 2048): (1) the Gluon backward's GPU suite
# (every variant and head dim, both forwards, masks and dtypes; the swizzled tile as "ws-swizzled"; the
# deterministic mode both ways; the backward through the API) and the persistent forward's tile-loop
# tests; (2) a probe of d = 64's causal walk at N = 512 / 1024; (3) the train sweep with the new defaults,
# every head dim, cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run119.sh OUT        (writes OUT/summary.log and OUT/run119.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run119.tar.gz" -C "$w" .; }
{
timeout 200 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider \
    -k "test_hopper_backward or backward_through_the_api or deterministic or persistent_tile_loop" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
# d = 64 causal at N = 512 / 1024 (0.77 / 0.84x cuDNN): the persistent kernel's LPT walk (default) moved
# 1.77x cuDNN's DRAM bytes at 512 (-zze: K / V re-read, the head's tiles a grid apart), the paired walk
# was -18 % there (§66); the one-tile ping-pong kernel (grid order: a head's tiles together) as a third
timeout 60 python3 benchmarks/ab_fwd.py --out "$w" --tag walk64 --headdims 64 --causal 1 --seqlens 512,1024 \
    --loads gluon-pers-lean,gluon-pers-lean-pair,gluon-pp-lean --rounds 2 --rest 0.2 > "$w/walk64.log" 2>&1
echo "walk64 rc=$?"; grep -A4 "^  d c" "$w/walk64.log"; pack
timeout 330 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$?"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " (fwd|bwd) " | head -n 80
pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
