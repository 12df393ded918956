#!/usr/bin/env bash
# Third device call of the twelfth session (2026-12-02), after run 73 (NOTES §66): (1) GPU tests of the
# default dispatch with the new policy (the persistent kernel with two Q buffers and the paired walk at
# d = 128 causal to 4096, d = 64 causal from 512) and of the persistent variant's forward; (2) ab_fwd:
# d = 128 causal at 8192 / 16384 (one-tile ping-pong, the default there, against the persistent kernel
# with its new defaults), d = 256 causal 512-4096 (ping-pong against the persistent kernel with the
# paired walk forced; one Q buffer there); (3) Nsight Compute source counters of the persistent kernel
# at d = 128, N = 512, non-causal (where ~2.6 us a tile is fixed cost, §66's reading), and cuDNN's
# forward's summary in the same call.
# Usage: bash benchmarks/session_gpu_run74.sh OUT        (writes OUT/summary.log and OUT/run74.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 200 python3 -m pytest -q -x -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "default_dispatch or (test_hopper_forward and persistent and not tile_loop and not exp2 and not accumulator)" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
ab() {  # tag headdim causal seqlens loads
    timeout 170 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 2 --rest 0.1 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -A8 "^  d c" "$w/$1.log"
}
ab ab_pers_128c_long 128 1 8192,16384 gluon-pp-lean,gluon-pers-lean
ab ab_pers_256c 256 1 512,1024,2048,4096 gluon-pp-lean,gluon-pers-lean-pair
secs="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis"
timeout 120 ncu --clock-control none --kernel-name regex:"hopper_fwd|sdpa|fprop|fmha" --launch-skip 4 --launch-count 2 \
    $secs --section SourceCounters -f -o "$w/fwd512" python3 benchmarks/ncu_fwd.py --variants persistent --cudnn \
    --seqlen 512 --headdim 128 > "$w/ncu_fwd512.log" 2>&1
echo "ncu rc=$?"
ncu -i "$w/fwd512.ncu-rep" --page details > "$w/ncu_fwd512_details.txt" 2>&1
ncu -i "$w/fwd512.ncu-rep" --page source --csv --print-source sass --kernel-name regex:hopper_fwd \
    > "$w/ncu_fwd512_source.csv" 2>&1
echo "export rc=$? $(wc -c < "$w/ncu_fwd512_source.csv") bytes"; gzip -f "$w/ncu_fwd512_source.csv"
rm -f "$w/fwd512.ncu-rep"
grep -E "^  [a-zA-Z_].*\(|Duration|Warp Cycles Per Issued|No Eligible|Issued Warp|L2 Hit|DRAM Through|Compute \(SM\)" \
    "$w/ncu_fwd512_details.txt" | cut -c1-110
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run74.tar.gz" -C "$w" . && rm -rf "$w"
