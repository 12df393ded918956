#!/usr/bin/env bash
# Device call for the next session (written 2026-12-02, tenth session; NOTES §60): the persistent
# forward's causal walk grouped by heads (hopper.persistent_grouped_walk, off until measured).
# (1) GPU tests: test_hopper_forward_persistent_tile_loop, both walks (every head dim, shapes whose head
#     counts leave a smaller last group), -v;
# (2) ab_fwd, causal only, 2 interleaved rounds with rest, cuDNN in the same run: the portable kernel
#     (tma), ping-pong, persistent with the whole-grid LPT walk and with the grouped walk.
# Usage: bash benchmarks/session_gpu_run64.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 120 python3 -m pytest tests/test_gpu.py -k "persistent_tile_loop" -n 16 -v -p no:cacheprovider -rfE \
    > "$out/test_gpu_walk.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu_walk.log"; grep -E " FAILED | ERROR " "$out/test_gpu_walk.log" | head -n 5
for d in 128 64 256; do  # at most 120 + 3 x 150 s
    timeout 150 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_walk$d --headdims $d --causal 1 \
        --seqlens 512,1024,2048,4096,16384 --loads tma,gluon-pp-lean,gluon-pers-lean,gluon-pers-lean-grp \
        --rounds 2 --rest 0.1 > "$out/ab_walk$d.log" 2>&1
    echo "ab d$d rc=$?"; tail -n 6 "$out/ab_walk$d.log"
done
