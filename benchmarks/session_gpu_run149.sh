#!/usr/bin/env bash
# NOTES §118: the softmax's row sum by the tensor cores (hopper.mma_row_sum, LEAN bit 6, off by
# default). (1) its GPU tests (every two-warpgroup variant and head dim, both masks, ragged / no-key
# rows / several tiles a program / GQA, bf16 and fp16); (2) ab_fwd, each head dim's default options
# with and without it, 3 interleaved rounds, cuDNN in the same run: the persistent kernel at d = 64 /
# 128 both masks and d = 256 causal, N = 512 ... 4096; the one-tile ping-pong at d = 128, 8192 / 16384.
# Usage: bash benchmarks/session_gpu_run149.sh OUT        (writes OUT/summary.log and OUT/run149.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run149.tar.gz" -C "$w" .; }
ab() {  # tag headdim causal seqlens loads
    timeout 120 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A5 "^  d c" "$w/$1.log"
    pack
}
{
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "mma_row_sum" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
ab ms64 64 0,1 512,1024,2048,4096 "gluon-pers-lean-ds,gluon-pers-lean-ds-ms"
ab ms128 128 0,1 512,1024,4096 "gluon-pers-lean-crw-qr-ds,gluon-pers-lean-crw-qr-ds-ms"
ab ms256 256 1 512,1024,4096 "gluon-pers-lean-crw-ds,gluon-pers-lean-crw-ds-ms"
ab ms128pp 128 0,1 8192,16384 "gluon-pp-lean-crw-qr-ds,gluon-pp-lean-crw-qr-ds-ms"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
