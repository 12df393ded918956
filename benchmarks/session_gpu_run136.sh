#!/usr/bin/env bash
# NOTES §111: the backward's preprocess in one launch (D, the lse rows, the zeroed dQ accumulator;
# hopper_backward.WS_FUSED_PREPROCESS, ab_bwd "gluon-ws-fusedprep"): (1) its GPU tests (the backward
# suite's shapes, both forwards, masks, dtypes, d = 64 / 128 / 256; 6 workers); (2) ab_bwd against the
# default and cuDNN, N = 512 ... 16384 (d = 256 to 4096), 3 rounds.
# Usage: bash benchmarks/session_gpu_run136.sh OUT        (writes OUT/summary.log and OUT/run136.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run136.tar.gz" -C "$w" .; }
ab() {  # tag headdims seqlens timeout
    timeout "$4" python3 benchmarks/ab_bwd.py --out "$w" --tag "$1" --headdims "$2" --seqlens "$3" \
        --providers gluon-ws,gluon-ws-fusedprep,sdpa-cudnn --rounds 3 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error|FAIL" "$w/$1.log" | head -4; grep -A14 "^  d c" "$w/$1.log"; pack
}
{
timeout 170 python3 -m pytest -q -n 6 tests/test_gpu.py -p no:cacheprovider -k "test_hopper_backward and ws-fusedprep" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
ab prep 128,64 512,1024,4096,16384 200
ab prep256 256 512,1024,4096 90
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
