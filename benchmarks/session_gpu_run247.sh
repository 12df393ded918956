#!/usr/bin/env bash
# NOTES §164, the forward's products over 96 of d = 128's columns (hopper.SPLIT_COLS_TILES[128]): (1)
# ab_padded's forward at d = 96 / 80, split ("gluon-pad") against wide ("gluon-pad-wide"), cuDNN in the same
# process; (2) the GPU tests (split against wide bitwise at d = 72 / 96 and the other split dims, the
# padded path at 96); (3) memcheck at d = 96; (4) the project's benchmark at d = 96.
# Usage: bash benchmarks/session_gpu_run247.sh OUT   (writes OUT/summary.log, OUT/ab_padded.*, OUT/tests.log,
# OUT/memcheck.log, OUT/train.log, OUT/train/)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 90 python3 benchmarks/ab_padded.py --out "$out" --passes fwd --headdims 96,80 --rounds 3 \
    --seqlens 512,2048,4096,16384 --providers gluon-pad,gluon-pad-wide,sdpa-cudnn > "$out/ab_padded.log" 2>&1
echo "ab_padded rc=$? $(( $(date +%s) - t0 ))s"
grep -E "^(fwd|bwd|pass) " "$out/ab_padded.log"
grep -vE "^(fwd|bwd|pass) " "$out/ab_padded.log" | head -6
t0=$(date +%s)
timeout 110 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "test_hopper_split_cols or (test_hopper_padded and 96)" > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
t0=$(date +%s)
timeout 40 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --padded --heads 96 \
    > "$out/memcheck.log" 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 ))s: $(grep -E "ERROR SUMMARY|done" "$out/memcheck.log" | tr '\n' ' ')"
t0=$(date +%s)
timeout 60 python3 -m ioattn bench train --headdims 96 --providers ioattn,sdpa-cudnn --out "$out/train" \
    > "$out/train.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 ))s"
grep -A40 "== train sweep" "$out/train.log" | grep -E " fwd |== train"
} 2>&1 | tee "$out/summary.log"
