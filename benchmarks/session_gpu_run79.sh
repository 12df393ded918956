#!/usr/bin/env bash
# Thirteenth session, second call: (1) memcheck on the forward at d = 64 and 256 (run 78 did 128);
# (2) NOTES §71: how much of the N = 16384 forward the last wave's idle SMs cost. bf16, batch 1,
# 16384 tokens, non-causal: the bench's head count (d = 128: 16 heads, 2048 tiles of 128 rows = 15.5
# waves of 132 SMs; d = 256: 8 heads, 1024 tiles = 7.8 waves) against 33 heads (4224 tiles = 32 whole
# waves), the ping-pong and persistent kernels and cuDNN in the same run. Checked at N = 2048 first.
# Usage: bash benchmarks/session_gpu_run79.sh OUT        (writes OUT/summary.log and OUT/run79.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
for d in 64 256; do
    timeout 120 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --heads $d \
        > "$w/sanitizer_memcheck_d$d.log" 2>&1
    echo "memcheck d=$d rc=$?: $(tail -n 1 "$w/sanitizer_memcheck_d$d.log")"
done
ab() {  # tag headdim heads timeout
    timeout "$4" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --heads "$3" --causal 0 \
        --seqlens 2048,16384 --loads gluon-pp-lean,gluon-pers-lean --rounds 3 --rest 0.1 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -A3 "^  d c" "$w/$1.log"
}
ab waves_128_h16 128 16 100
ab waves_128_h33 128 33 100
ab waves_256_h8 256 8 90
ab waves_256_h33 256 33 100
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run79.tar.gz" -C "$w" . && rm -rf "$w"
