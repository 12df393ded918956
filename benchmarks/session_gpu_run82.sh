#!/usr/bin/env bash
# Thirteenth session, fifth call: (1) the default dispatch's GPU tests with NOTES §72's policy (d = 256
# persistent: non-causal to 2048, causal 1024-8192) and the persistent tile loop at d = 256; (2) the
# train sweep with this session's defaults (three interleaved rounds, every head dim, SDPA's flash and
# cuDNN backends in the same run); (3) memcheck and racecheck at d = 256 (the persistent kernel's Q
# buffer now written by the epilogue, then by the next Q's TMA).
# Usage: bash benchmarks/session_gpu_run82.sh OUT        (writes OUT/summary.log and OUT/run82.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 100 python3 -m pytest -q -x -n 12 tests/test_gpu.py -p no:cacheprovider \
    -k "default_dispatch or (persistent_tile_loop and 256)" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
timeout 290 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-flash,sdpa-cudnn \
    --out "$w/train" > "$w/train.log" 2>&1
echo "train rc=$?"
sed -n '/== train sweep/,$p' "$w/train.log" | grep " fwd \| bwd " | head -n 80
timeout 80 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --heads 256 \
    > "$w/sanitizer_memcheck_d256.log" 2>&1
echo "memcheck d=256 rc=$?: $(tail -n 1 "$w/sanitizer_memcheck_d256.log")"
timeout 100 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_small.py --heads 256 \
    > "$w/sanitizer_racecheck_d256.log" 2>&1
echo "racecheck d=256 rc=$?: $(tail -n 1 "$w/sanitizer_racecheck_d256.log")"
grep -h -o "at [a-z_]*+0x[0-9a-f]* in [a-z_]*.py:[0-9]*" "$w/sanitizer_racecheck_d256.log" | sed 's/+0x[0-9a-f]*//' \
    | sort | uniq -c | sort -rn | head -n 20
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run82.tar.gz" -C "$w" . && rm -rf "$w"
