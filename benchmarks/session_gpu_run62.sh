#!/usr/bin/env bash
# Device call C of 2026-12-02 (tenth session): (1) the Gluon forward tests call B's 240 s did not reach
# (the last ones in file order: negative scale, default dispatch, d = 256 through the API, persistent
# tile loop, LPT order, exp2 on the FMA units), with the new defaults; (2) Nsight Compute on the short
# causal forward, where the train sweep is furthest behind cuDNN (d = 128 N = 512: 0.66x; causal takes
# as long as non-causal there): ping-pong and persistent against cuDNN, causal and not; (3) the d = 256
# backward and cuDNN's at N = 4096 (session_gpu_run60.sh: source counters).
# Usage: bash benchmarks/session_gpu_run62.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 -m pytest tests/test_gpu.py -n 8 -q -p no:cacheprovider -rfE \
    -k "negative_scale or default_dispatch or d256_through_the_api or persistent_tile_loop or lpt_order or exp2_fma" \
    > "$out/test_gpu_rest.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu_rest.log"; grep -E "FAILED|ERROR" "$out/test_gpu_rest.log" | head -n 5
secs="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis"
for mask in causal noncausal; do
    flag=$([ $mask = causal ] && echo --causal)
    timeout 90 ncu --clock-control none --kernel-name regex:"hopper_fwd|sdpa|fprop|fmha" --launch-skip 6 --launch-count 3 \
        $secs python3 benchmarks/ncu_fwd.py --variants pingpong,persistent --cudnn --seqlen 512 --headdim 128 $flag \
        > "$out/ncu_fwd512_$mask.txt" 2>&1
    echo "ncu fwd $mask rc=$?"
    grep -E "^  [a-zA-Z_].*\(|Duration|Warp Cycles Per Issued|No Eligible|Registers Per|Achieved Occupancy|Waves Per SM|Grid Size|Block Size" \
        "$out/ncu_fwd512_$mask.txt" | cut -c1-110
done
bash benchmarks/session_gpu_run60.sh "$out"
