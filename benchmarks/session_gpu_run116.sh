#!/usr/bin/env bash
# (Its FA3 steps found no flash_attn3_jax on the device; their script, benchmarks/fa3_jax_bwd.py, was then
# removed: NOTES §99. The ab_bwd and the ncu of ours ran.)
# Nineteenth session: FlashAttention-3's backward (flash_attn3_jax, if the device has it) against ours
# and cuDNN's at d = 128. FA3 runs the same tile as ours when causal (64 query rows x 128 keys, two
# consumer warpgroups, S^T / dP^T with the keys as the wgmma M side) and was 1.1-1.3x cuDNN in the
# peers' anchor table, where ours is 0.93-1.01x. (1) FA3's time at the grid's d = 128 points and ours
# and cuDNN's by ab_bwd in the same call; (2) the three backward kernels under Nsight Compute at
# N = 4096 causal, the same sections each, for what FA3's kernel does differently at the same tile.
# Usage: bash benchmarks/session_gpu_run116.sh OUT        (OUT/summary.log, OUT/run116.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
secs="--section SpeedOfLight --section WarpStateStats --section InstructionStats --section LaunchStats"
secs="$secs --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables"
pack() { tar -czf "$out/run116.tar.gz" -C "$w" .; }
show() {
    ncu -i "$w/$1.ncu-rep" --page raw --csv > "$w/ncu_$1_raw.csv" 2>&1
    ncu -i "$w/$1.ncu-rep" --page details > "$w/ncu_$1_details.txt" 2>&1; rm -f "$w/$1.ncu-rep"
    grep -E "^  [a-zA-Z_].*\(|Duration|Warp Cycles Per Issued|Issued Warp Per|Executed Instructions  |Registers Per|Shared Memory Config|Compute \(SM\) Thr|Block Limit" \
        "$w/ncu_$1_details.txt" | cut -c1-120
    pack
}
{
python3 -c "import jax, flash_attn3_jax; print('jax', jax.__version__, 'fa3', getattr(flash_attn3_jax, '__version__', '?'), jax.devices())" 2>&1 | tail -n 2
timeout 150 python3 benchmarks/fa3_jax_bwd.py --headdim 128 --seqlens 1024,4096,16384 --causal 0,1 > "$w/fa3.jsonl" 2> "$w/fa3.err"
echo "fa3 rc=$?"; cat "$w/fa3.jsonl"; tail -n 3 "$w/fa3.err"; pack
timeout 150 python3 benchmarks/ab_bwd.py --out "$w" --tag ab128 --headdims 128 --seqlens 1024,4096,16384 \
    --providers gluon-ws,sdpa-cudnn --rounds 2 > "$w/ab128.log" 2>&1
echo "ab128 rc=$?"; grep -A8 "^  d c" "$w/ab128.log" || tail -n 5 "$w/ab128.log"; pack
timeout 120 ncu --clock-control none --kernel-name "regex:[Bb]wd" --launch-count 4 $secs -f -o "$w/fa3c" \
    python3 benchmarks/fa3_jax_bwd.py --profile --headdim 128 --seqlens 4096 --causal 1 > "$w/ncu_fa3c.log" 2>&1
echo "ncu fa3 rc=$?"; tail -n 2 "$w/ncu_fa3c.log"; show fa3c
timeout 120 ncu --clock-control none --nvtx --nvtx-include "ioattn-d128/" --kernel-name regex:hopper_bwd $secs \
    -f -o "$w/oursc" python3 benchmarks/ncu_bwd.py --headdims 128 --seqlen 4096 --causal > "$w/ncu_oursc.log" 2>&1
echo "ncu ours rc=$?"; tail -n 1 "$w/ncu_oursc.log"; show oursc
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
