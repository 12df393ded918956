#!/usr/bin/env bash
# Prepared in the seventeenth session for the next one (NOTES plan, candidate 1): the short forward's
# stall table (NOTES §91's method) before any change: the persistent kernel (the default at N = 512)
# at d = 64 and 128, non-causal and causal, with SDPA's cuDNN forward profiled in the same process.
# Per profile: duration, executed instructions, warp cycles per issued instruction and the stall
# reasons (raw CSV), for ours against cuDNN's.
# Usage: bash benchmarks/session_gpu_run109.sh OUT        (writes OUT/summary.log and OUT/run109.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run109.tar.gz" -C "$w" .; }
{
for d in 64 128; do
    for c in "" "--causal"; do
        tag="n512d${d}${c:+c}"
        # warm-up: 2 calls of ours, 2 of cuDNN's; then one profiled launch of each
        timeout 100 ncu --clock-control none --kernel-name "regex:hopper_fwd|fmha|fprop|sdpa" --launch-skip 4 \
            --launch-count 2 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
            --section InstructionStats --section LaunchStats -f -o "$w/$tag" \
            python3 benchmarks/ncu_fwd.py --variants persistent --seqlen 512 --headdim $d $c --cudnn \
            > "$w/ncu_$tag.log" 2>&1
        echo "ncu $tag rc=$?"; tail -n 1 "$w/ncu_$tag.log"
        ncu -i "$w/$tag.ncu-rep" --page raw --csv > "$w/ncu_${tag}_raw.csv" 2>&1
        ncu -i "$w/$tag.ncu-rep" --page details > "$w/ncu_${tag}_details.txt" 2>&1; rm -f "$w/$tag.ncu-rep"
        grep -E "^  [a-zA-Z_].*\(|Duration|Warp Cycles Per Issued|Issued Warp Per|Executed Instructions  |Waves Per SM" \
            "$w/ncu_${tag}_details.txt" | cut -c1-110
        pack
    done
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
