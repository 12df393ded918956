#!/usr/bin/env bash
# NOTES §100: (1) the backward suite's largest shape, (2, 4096, 4096, 8, 2), again at 4 workers: in
# run119 its 23 failures were all the float64 oracle's CUDA out-of-memory with 14 workers on the one GPU
# (every other backward test passed); (2) the flat-dQ backward's stalls by SASS instruction at d = 128,
# N = 4096 (ncu source counters, exported as CSV) for the next session's plan.
# Usage: bash benchmarks/session_gpu_run120.sh OUT        (writes OUT/summary.log and OUT/run120.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run120.tar.gz" -C "$w" .; }
{
timeout 200 python3 -m pytest -q -n 4 tests/test_gpu.py -p no:cacheprovider -k "test_hopper_backward and shape6" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -12
pack
timeout 150 ncu --clock-control none --nvtx --nvtx-include "ioattn-d128/" --kernel-name regex:hopper_bwd \
    --section WarpStateStats --section SourceCounters -f -o "$w/src" \
    python3 benchmarks/ncu_bwd.py --headdims 128 --seqlen 4096 > "$w/ncu_src.log" 2>&1
echo "ncu rc=$?"; tail -n 1 "$w/ncu_src.log"
ncu -i "$w/src.ncu-rep" --page source --csv --print-source sass > "$w/ncu_src_sass.csv" 2>&1
echo "export rc=$? $(wc -c < "$w/ncu_src_sass.csv") bytes"; gzip -f "$w/ncu_src_sass.csv"; rm -f "$w/src.ncu-rep"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
