#!/usr/bin/env bash
# Fifth device call of the seventeenth session (2026-12-02), NOTES §91 (predictions written first):
# (1) Nsight Compute on the ping-pong forward at d = 256 and 128, N = 16384, the row sum reduced every
# key tile and once a tile (hopper.deferred_row_sum off / on): warp-state statistics, to test §89's
# reading of its d = 256 gain (the sum's shuffle latency on the key step's path); (2) ab_fwd on wg3
# at d = 64 with a five-slot K / V ring against the default four (-s5; 6 does not fit).
# Usage: bash benchmarks/session_gpu_run104.sh OUT        (writes OUT/summary.log and OUT/run104.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run104.tar.gz" -C "$w" .; }
{
for d in 256 128; do
    # warm-up: 2 calls x (off, on); then the two profiled launches, off first
    timeout 110 ncu --clock-control none --kernel-name regex:hopper_fwd --launch-skip 4 --launch-count 2 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
        -f -o "$w/ds$d" python3 benchmarks/ncu_fwd.py --variants pingpong --headdim $d --deferred-row-sum both \
        > "$w/ncu_ds$d.log" 2>&1
    echo "ncu d=$d rc=$?"; tail -n 2 "$w/ncu_ds$d.log"
    ncu -i "$w/ds$d.ncu-rep" --page raw --csv > "$w/ncu_ds${d}_raw.csv" 2>&1
    ncu -i "$w/ds$d.ncu-rep" --page details > "$w/ncu_ds${d}_details.txt" 2>&1; rm -f "$w/ds$d.ncu-rep"
    grep -E "Duration|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Executed Instructions  " "$w/ncu_ds${d}_details.txt"
    pack
done
ab() {  # tag headdim causal seqlens loads timeout
    timeout "$6" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" \
        --seqlens "$4" --loads "$5" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A12 "^  d c" "$w/$1.log"
    pack
}
ab s5_64 64 0 2048,4096,8192,16384 gluon-wg3-crw-ds,gluon-wg3-crw-s5-ds 110
ab s5_64c 64 1 8192,16384 gluon-wg3-crw,gluon-wg3-crw-s5 80
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
