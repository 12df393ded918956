#!/usr/bin/env bash
# Thirteenth session, fourth call: NOTES §72, the persistent forward at d = 256 with its output staged
# in the Q buffer. (1) GPU tests of the persistent kernel at d = 256 (tile loop, every forward shape of
# test_hopper_forward) and the default dispatch; (2) ab_fwd d = 256, both masks, persistent with it /
# without it (-accstore), the ping-pong kernel and cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run81.sh OUT        (writes OUT/summary.log and OUT/run81.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 150 python3 -m pytest -q -x -n 12 tests/test_gpu.py -p no:cacheprovider \
    -k "(persistent and 256) or default_dispatch" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
timeout 300 python3 benchmarks/ab_fwd.py --out "$w" --tag rows_q_256 --headdims 256 --causal 0,1 \
    --seqlens 512,1024,2048,4096,8192,16384 --loads gluon-pp-lean,gluon-pers-lean,gluon-pers-lean-accstore \
    --rounds 3 --rest 0.1 > "$w/rows_q_256.log" 2>&1
echo "rows_q_256 rc=$?"; grep -A14 "^  d c" "$w/rows_q_256.log"
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run81.tar.gz" -C "$w" . && rm -rf "$w"
