#!/usr/bin/env bash
# Device call B of 2026-12-01 (sixth session), with the SM clock and board power sampled every 50 ms:
# (1) `ioattn bench decode` (the table, three interleaved rounds) against cuDNN, eager / graph / paged;
# (2) the sustained-load probe (benchmarks/power_probe.py): run33 saw the board's software power cap
# (clock reason 0x4) at ~690 W with the SM clock down to 1695 MHz during the d=128 forward, whose three
# rounds at N=16384 drifted 3.35 -> 3.84 ms while cuDNN's stayed at 3.22-3.30: clock, power and joules
# per call for ours and cuDNN's; (3) Nsight Compute sections (instructions per pipe, memory) of the
# d=128 N=16384 forward, ours against cuDNN's.
# Usage: bash benchmarks/session_gpu_run34.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
bash benchmarks/smi_log.sh "$out/smi.csv" 50 &
smi=$!
mkdir -p "$out/decode"
timeout 240 python3 -m ioattn bench decode --out "$out/decode" --providers ioattn,ioattn-paged,sdpa-cudnn --rounds 3 \
    > "$out/decode/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode/*.png
timeout 90 python3 benchmarks/power_probe.py --smi "$out/smi.csv" --out "$out/power.jsonl" > "$out/power.log" 2>&1
echo "power rc=$?"
kill $smi 2>/dev/null
timeout 150 ncu --clock-control none --kernel-name regex:"hopper_fwd|sdpa|fprop|fmha" --launch-count 10 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis \
    python3 benchmarks/ncu_fwd.py --variants pingpong --cudnn --seqlen 16384 --headdim 128 > "$out/ncu_fwd.txt" 2>&1
echo "ncu rc=$?"
python3 benchmarks/decode_table.py "$out/decode/results.jsonl"
tail -n 12 "$out/power.log"
grep -E "^  [a-z_]+.*\(|Duration|Executed Ipc A|Issue Slots Busy|SM Busy|Memory Throughput|L2 Hit|Executed Instructions  |SM Frequency" \
    "$out/ncu_fwd.txt" | head -n 40
