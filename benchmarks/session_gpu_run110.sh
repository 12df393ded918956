#!/usr/bin/env bash
# Eighteenth session (NOTES plan, candidate 2, its first step): the d = 128 backward's stall table
# (NOTES §91's method) before any change: the warp-specialised kernel at N = 4096, non-causal, and
# cuDNN's backward kernels profiled alone (no warm-up there: its first call is profiled).
# Per profile: duration, executed instructions, warp cycles per issued instruction and the stall
# reasons (raw CSV). Usage: bash benchmarks/session_gpu_run110.sh OUT   (OUT/summary.log, OUT/run110.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
secs="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section LaunchStats"
pack() { tar -czf "$out/run110.tar.gz" -C "$w" .; }
show() {
    ncu -i "$w/$1.ncu-rep" --page raw --csv > "$w/ncu_$1_raw.csv" 2>&1
    ncu -i "$w/$1.ncu-rep" --page details > "$w/ncu_$1_details.txt" 2>&1; rm -f "$w/$1.ncu-rep"
    grep -E "^  [a-zA-Z_].*\(|Duration|Warp Cycles Per Issued|Issued Warp Per|Executed Instructions  |Waves Per SM" \
        "$w/ncu_$1_details.txt" | cut -c1-110
    pack
}
{
timeout 150 ncu --clock-control none --nvtx --nvtx-include "ioattn-d128/" --kernel-name regex:hopper_bwd $secs \
    -f -o "$w/bwd128" python3 benchmarks/ncu_bwd.py --headdims 128 --seqlen 4096 > "$w/ncu_bwd128.log" 2>&1
echo "ncu ours rc=$?"; tail -n 1 "$w/ncu_bwd128.log"; show bwd128
timeout 120 ncu --clock-control none --kernel-name "regex:bprop|dgrad|bwd" --launch-count 3 $secs \
    -f -o "$w/cudnn128" python3 benchmarks/ncu_bwd.py --headdims 128 --seqlen 4096 --cudnn-only \
    > "$w/ncu_cudnn128.log" 2>&1
echo "ncu cudnn rc=$?"; tail -n 1 "$w/ncu_cudnn128.log"; show cudnn128
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
