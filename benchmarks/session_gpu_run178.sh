#!/usr/bin/env bash
# After NOTES §133: where d = 64 causal N = 512 still trails cuDNN (0.985x in run176) with the table's 4 MB
# groups. Nsight Compute, one launch each (warp states, stalls by SASS instruction, memory throughput):
# ours (the default: persistent, the table) and cuDNN's kernel, as §130 did at N = 1024.
# Usage: bash benchmarks/session_gpu_run178.sh OUT        (writes OUT/summary.log and OUT/run178.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run178.tar.gz" -C "$w" .; }
prof() {  # tag kernel-regex skip ncu_fwd-args...
    tag=$1; re=$2; skip=$3; shift 3
    timeout 120 ncu --clock-control none --kernel-name "regex:$re" --launch-skip "$skip" --launch-count 1 \
        --section WarpStateStats --section SourceCounters --section SpeedOfLight --section MemoryWorkloadAnalysis \
        -f -o "$w/$tag" python3 benchmarks/ncu_fwd.py "$@" > "$w/ncu_$tag.log" 2>&1
    echo "ncu $tag rc=$?"; tail -n 1 "$w/ncu_$tag.log"
    ncu -i "$w/$tag.ncu-rep" --page details --csv > "$w/${tag}_details.csv" 2>&1
    ncu -i "$w/$tag.ncu-rep" --page source --csv --print-source sass > "$w/${tag}_sass.csv" 2>&1
    echo "export rc=$? $(wc -c < "$w/${tag}_sass.csv") bytes"; gzip -f "$w/${tag}_sass.csv"; rm -f "$w/$tag.ncu-rep"
    pack
}
{
prof d64c512 hopper_fwd 2 --variants persistent --seqlen 512 --headdim 64 --causal
prof d64c512cudnn "fprop|fmha|sdpa" 2 --variants "" --cudnn --seqlen 512 --headdim 64 --causal
for t in d64c512 d64c512cudnn; do
    echo "== $t"; grep -E '"(Warp Cycles Per Issued Instruction|Issued Warp Per Scheduler|Duration|SM Frequency|Compute \(SM\) Throughput|DRAM Throughput|L2 Hit Rate|Memory Throughput|No Eligible)"' "$w/${t}_details.csv" | cut -d, -f12- | head -10
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
