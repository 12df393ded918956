#!/usr/bin/env bash
# NOTES §137 (a diagnostic): is d = 64 non-causal N = 1024 (0.99x cuDNN in the sweeps) the persistent grid's
# wave remainder (4096 equal tiles over 132 programs: 4 programs take a 32nd tile while 128 stop at 31)?
# Nsight Compute, one launch each: ours (the default: persistent) and cuDNN's kernel, the SMs' active
# cycles (average, minimum, maximum) beside the duration, clock and memory throughput.
# Usage: bash benchmarks/session_gpu_run184.sh OUT        (writes OUT/summary.log and OUT/run184.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run184.tar.gz" -C "$w" .; }
prof() {  # tag kernel-regex skip ncu_fwd-args...
    tag=$1; re=$2; skip=$3; shift 3
    timeout 120 ncu --clock-control none --kernel-name "regex:$re" --launch-skip "$skip" --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats \
        --metrics sm__cycles_active.avg,sm__cycles_active.min,sm__cycles_active.max,sm__cycles_elapsed.max \
        -f -o "$w/$tag" python3 benchmarks/ncu_fwd.py "$@" > "$w/ncu_$tag.log" 2>&1
    echo "ncu $tag rc=$?"; tail -n 1 "$w/ncu_$tag.log"
    ncu -i "$w/$tag.ncu-rep" --page details --csv > "$w/${tag}_details.csv" 2>&1
    ncu -i "$w/$tag.ncu-rep" --page raw --csv > "$w/${tag}_raw.csv" 2>&1
    gzip -f "$w/${tag}_raw.csv"; rm -f "$w/$tag.ncu-rep"
    pack
}
{
prof d64n1024 hopper_fwd 2 --variants persistent --seqlen 1024 --headdim 64
prof d64n1024cudnn "fprop|fmha|sdpa" 2 --variants "" --cudnn --seqlen 1024 --headdim 64
for t in d64n1024 d64n1024cudnn; do
    echo "== $t"; grep -E '"(Duration|SM Frequency|Elapsed Cycles|SM Active Cycles|Compute \(SM\) Throughput|DRAM Throughput|L2 Hit Rate|Grid Size|Block Size|Waves Per SM|sm__cycles_active.avg|sm__cycles_active.min|sm__cycles_active.max|sm__cycles_elapsed.max)"' "$w/${t}_details.csv" | cut -d, -f12- | head -16
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
