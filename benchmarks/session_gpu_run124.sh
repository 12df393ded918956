#!/usr/bin/env bash
# Prepared in the nineteenth session for the next one (NOTES §102, §103): the backward's dO slot released
# with the dQ block (WS_LATE_DO_RELEASE, ab_bwd "gluon-ws-latedo") and D in dP^T's accumulator at d = 128
# (WS_D_IN_ACC, "gluon-ws-dacc"): (1) their GPU tests (the backward suite's shapes, both forwards,
# masks and dtypes, 6 workers); (2) ab_bwd against the default and cuDNN, d = 128 / 64, 3 rounds.
# Usage: bash benchmarks/session_gpu_run124.sh OUT        (writes OUT/summary.log and OUT/run124.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run124.tar.gz" -C "$w" .; }
{
timeout 150 python3 -m pytest -q -n 6 tests/test_gpu.py -p no:cacheprovider -k "test_hopper_backward and (ws-latedo or ws-dacc)" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
timeout 260 python3 benchmarks/ab_bwd.py --out "$w" --tag latedo --headdims 128,64 --seqlens 1024,4096,16384 \
    --providers gluon-ws,gluon-ws-latedo,gluon-ws-dacc,sdpa-cudnn --rounds 3 > "$w/latedo.log" 2>&1
echo "ab rc=$?"; grep -E "Error|error|FAIL" "$w/latedo.log" | head -4; grep -A14 "^  d c" "$w/latedo.log"; pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
