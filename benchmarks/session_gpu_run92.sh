#!/usr/bin/env bash
# Last device call of the fourteenth session (2026-12-02): (1) GPU tests of the persistent forward
# after persistent wg3's removal (NOTES §75: `_persistent_fwd` back to two warpgroups); (2) Nsight
# Compute on the d = 64, N = 512 non-causal forward (the two-warpgroup persistent kernel, the default
# there, 0.83x cuDNN) against cuDNN's in the same process: a diagnosis for the next session (NOTES §82),
# as §67 did at d = 128.
# Usage: bash benchmarks/session_gpu_run92.sh OUT        (writes OUT/summary.log and OUT/run92.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 120 python3 -m pytest -q -x -n 12 tests/test_gpu.py -p no:cacheprovider \
    -k "persistent_tile_loop or (test_hopper_forward and persistent and not exp2 and not accumulator) or default_dispatch" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
secs="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section InstructionStats"
timeout 120 ncu --clock-control none --kernel-name regex:"hopper_fwd|sdpa|fprop|fmha" --launch-skip 4 --launch-count 2 \
    $secs --section SourceCounters -f -o "$w/fwd512d64" python3 benchmarks/ncu_fwd.py --variants persistent --cudnn \
    --seqlen 512 --headdim 64 > "$w/ncu_fwd512d64.log" 2>&1
echo "ncu rc=$?"
ncu -i "$w/fwd512d64.ncu-rep" --page details > "$w/ncu_fwd512d64_details.txt" 2>&1
ncu -i "$w/fwd512d64.ncu-rep" --page source --csv --print-source sass --kernel-name regex:hopper_fwd \
    > "$w/ncu_fwd512d64_source.csv" 2>&1
echo "export rc=$? $(wc -c < "$w/ncu_fwd512d64_source.csv") bytes"; gzip -f "$w/ncu_fwd512d64_source.csv"
rm -f "$w/fwd512d64.ncu-rep"
grep -E "^  [a-zA-Z_].*\(|Duration|Elapsed Cycles|Warp Cycles Per Issued|No Eligible|Issued Warp|L2 Hit|DRAM Through|Compute \(SM\)|Executed Instructions  |Registers Per|Grid Size|Block Size|Dynamic Shared" \
    "$w/ncu_fwd512d64_details.txt" | cut -c1-120
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run92.tar.gz" -C "$w" . && rm -rf "$w"
