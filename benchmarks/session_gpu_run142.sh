#!/usr/bin/env bash
# NOTES §114 (a diagnostic): the short forward's stall table (NOTES §94's method) after §113, at the
# points still below cuDNN: the persistent kernel at N = 512, d = 64 non-causal and causal, d = 128
# causal, with SDPA's cuDNN forward profiled in the same process. Per profile: duration, executed
# instructions, warp cycles per issued instruction and the stall reasons (raw CSV), ours against cuDNN's.
# Usage: bash benchmarks/session_gpu_run142.sh OUT        (writes OUT/summary.log and OUT/run142.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run142.tar.gz" -C "$w" .; }
{
for spec in "64:" "64:--causal" "128:--causal"; do
    d=${spec%%:*}; c=${spec#*:}
    tag="n512d${d}${c:+c}"
    # warm-up: 2 calls of ours, 2 of cuDNN's; then one profiled launch of each
    timeout 80 ncu --clock-control none --kernel-name "regex:hopper_fwd|fmha|fprop|sdpa" --launch-skip 4 \
        --launch-count 2 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        --section InstructionStats --section LaunchStats -f -o "$w/$tag" \
        python3 benchmarks/ncu_fwd.py --variants persistent --seqlen 512 --headdim $d $c --cudnn \
        > "$w/ncu_$tag.log" 2>&1
    echo "ncu $tag rc=$?"; tail -n 1 "$w/ncu_$tag.log"
    ncu -i "$w/$tag.ncu-rep" --page raw --csv > "$w/ncu_${tag}_raw.csv" 2>&1
    ncu -i "$w/$tag.ncu-rep" --page details > "$w/ncu_${tag}_details.txt" 2>&1; rm -f "$w/$tag.ncu-rep"
    grep -E "^  [a-zA-Z_].*\(|Duration|Warp Cycles Per Issued|Issued Warp Per|Executed Instructions  " \
        "$w/ncu_${tag}_details.txt" | cut -c1-110
    pack
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
