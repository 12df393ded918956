#!/usr/bin/env bash
# NOTES §105: after each consumer warpgroup became a partition of its own in the d = 128 backward
# (WS_WG_PARTITIONS) and the dO slot's release moved to the dQ hand-off (§102): (1) the backward through
# the API (the dispatch's defaults); (2) compute-sanitizer memcheck and racecheck on the backward at a
# small shape, d = 64 / 128; (3) the train sweep at d = 128 / 64, cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run128.sh OUT        (writes OUT/summary.log and OUT/run128.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run128.tar.gz" -C "$w" .; }
{
timeout 60 python3 -m pytest -q -n 6 tests/test_gpu.py -p no:cacheprovider -k "backward_through_the_api" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
timeout 80 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --heads 64,128 --no-forward \
    > "$w/sanitizer_memcheck_bwd.log" 2>&1
echo "memcheck rc=$?: $(tail -n 1 "$w/sanitizer_memcheck_bwd.log")"; pack
timeout 100 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_small.py --heads 64,128 --no-forward \
    > "$w/sanitizer_racecheck_bwd.log" 2>&1
echo "racecheck rc=$?: $(tail -n 1 "$w/sanitizer_racecheck_bwd.log")"
grep -h -o "at [a-z_]*+0x[0-9a-f]* in [a-z_]*.py:[0-9]*" "$w/sanitizer_racecheck_bwd.log" | sed 's/+0x[0-9a-f]*//' \
    | sort | uniq -c | sort -rn | head -12
pack
timeout 250 python3 -m ioattn bench train --headdims 128,64 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$?"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " (fwd|bwd) " | head -n 60
pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
