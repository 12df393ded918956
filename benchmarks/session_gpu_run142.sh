#!/usr/bin/env bash
# NOTES §114: (1) the d = 64 persistent kernel's softmax options that were measured level or slower
# before §113 (conditional rescaling by the warp, §84; the deferred row sum, §89; the first step's mask
# under its own branch, §94), each on the new defaults, N = 512 / 1024 / 4096, both masks, 2 rounds;
# (2) a diagnostic: the short forward's stall table (§94's method) after §113 at a point still below
# cuDNN, N = 512, d = 64 non-causal, SDPA's cuDNN forward profiled in the same process
# (duration, executed instructions, warp cycles per issued instruction, stall reasons; raw CSV).
# Usage: bash benchmarks/session_gpu_run142.sh OUT        (writes OUT/summary.log and OUT/run142.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run142.tar.gz" -C "$w" .; }
{
p64=gluon-pers-lean
timeout 100 python3 benchmarks/ab_fwd.py --out "$w" --tag fwd64opts --headdims 64 --causal 0,1 \
    --seqlens 512,1024,4096 --loads $p64,$p64-crw,$p64-ds,$p64-mb --rounds 2 --rest 0.2 > "$w/fwd64opts.log" 2>&1
echo "fwd64opts rc=$?"; grep -E "Error|error" "$w/fwd64opts.log" | head -4; grep -A8 "^  d c" "$w/fwd64opts.log"
pack
for spec in "64:"; do
    d=${spec%%:*}; c=${spec#*:}
    tag="n512d${d}${c:+c}"
    # warm-up: 2 calls of ours, 2 of cuDNN's; then one profiled launch of each
    timeout 70 ncu --clock-control none --kernel-name "regex:hopper_fwd|fmha|fprop|sdpa" --launch-skip 4 \
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
