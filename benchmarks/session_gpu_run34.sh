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
fields=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$fields --format=csv,noheader > /dev/null 2>&1 || fields=${fields/clocks_event/clocks_throttle}
nvidia-smi --query-gpu=$fields --format=csv,noheader -lms 50 > "$out/smi.csv" 2>&1 &
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
python3 - "$out/decode/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
names = list(dict.fromkeys(r["provider"] for r in rows))
print("batch  kvlen " + " ".join(f"{n:>14}" for n in names) + "   rounds (ioattn | cudnn)")
for case in dict.fromkeys((r["batch"], r["seqlen_k"]) for r in rows):
    cell = {r["provider"]: r for r in rows if (r["batch"], r["seqlen_k"]) == case and r.get("ms")}
    us = {n: cell[n]["ms"] * 1e3 for n in cell}
    rr = lambda n: "/".join(f"{x * 1e3:.1f}" for x in cell[n].get("ms_rounds", [])) if n in cell else "-"
    print(f"{case[0]:>5} {case[1]:>6} " + " ".join(f"{us.get(n, float('nan')):>14.1f}" for n in names)
          + f"   {rr('ioattn')} | {rr('sdpa-cudnn')}")
PY
tail -n 12 "$out/power.log"
grep -E "^  [a-z_]+.*\(|Duration|Executed Ipc A|Issue Slots Busy|SM Busy|Memory Throughput|L2 Hit|Executed Instructions  |SM Frequency" \
    "$out/ncu_fwd.txt" | head -n 40
