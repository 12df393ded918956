#!/usr/bin/env bash
# NOTES §135: the d = 128 backward with its consumers' redundant partition barriers dropped from the
# PTX (hopper_backward.WS_PTX_BARRIERS). (1) test_hopper_backward's "ws-ptxbar" (d = 128, both forwards,
# masks, dtypes, the suite's shapes; each marked build checked to have nothing left for the pass);
# (2) ab_bwd d = 128, default / pass / cuDNN, 3 rounds, N = 1024 / 4096 / 16384, both masks, in two
# processes with the two builds in opposite order.
# Usage: bash benchmarks/session_gpu_run181.sh OUT        (writes OUT/summary.log and OUT/run181.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run181.tar.gz" -C "$w" .; }
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "test_hopper_backward and ws-ptxbar" \
    > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
for order in A B; do
    if [ $order = A ]; then prov=gluon-ws,gluon-ws-ptxbar,sdpa-cudnn; else prov=gluon-ws-ptxbar,gluon-ws,sdpa-cudnn; fi
    t0=$(date +%s)
    timeout 170 python3 benchmarks/ab_bwd.py --out "$w" --tag "ab$order" --headdims 128 --seqlens 1024,4096,16384 \
        --causal 0,1 --rounds 3 --providers $prov > "$w/ab$order.log" 2>&1
    echo "ab$order rc=$? $(( $(date +%s) - t0 ))s"; grep -A7 "^  d c" "$w/ab$order.log"; grep -i "error\|fail" "$w/ab$order.log" | head -4
    pack
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
