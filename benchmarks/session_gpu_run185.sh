#!/usr/bin/env bash
# NOTES §138 (a diagnostic, after §137): where the ~2 us of elapsed time with no SM active lie (the start
# of the launch or the end, after the last program exits), ours against cuDNN, d = 64 non-causal N = 1024:
# Nsight Compute's PM sampling timeline (the PmSampling section) of one launch each, its sampled metrics
# exported per interval (raw page, metric instances as values).
# Usage: bash benchmarks/session_gpu_run185.sh OUT        (writes OUT/summary.log and OUT/run185.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run185.tar.gz" -C "$w" .; }
prof() {  # tag kernel-regex skip ncu_fwd-args...
    tag=$1; re=$2; skip=$3; shift 3
    timeout 150 ncu --clock-control none --kernel-name "regex:$re" --launch-skip "$skip" --launch-count 1 \
        --section PmSampling --section SpeedOfLight \
        -f -o "$w/$tag" python3 benchmarks/ncu_fwd.py "$@" > "$w/ncu_$tag.log" 2>&1
    echo "ncu $tag rc=$?"; tail -n 2 "$w/ncu_$tag.log"
    ncu -i "$w/$tag.ncu-rep" --page raw --csv --print-metric-instances values > "$w/${tag}_raw.csv" 2>&1
    echo "raw rc=$? $(wc -c < "$w/${tag}_raw.csv") bytes"
    ncu -i "$w/$tag.ncu-rep" --page details --print-details all > "$w/${tag}_details.txt" 2>&1
    echo "details rc=$? $(wc -c < "$w/${tag}_details.txt") bytes"
    gzip -f "$w/${tag}_raw.csv" "$w/${tag}_details.txt"; rm -f "$w/$tag.ncu-rep"
    pack
}
{
prof d64n1024 hopper_fwd 2 --variants persistent --seqlen 1024 --headdim 64
prof d64n1024cudnn "fprop|fmha|sdpa" 2 --variants "" --cudnn --seqlen 1024 --headdim 64
for t in d64n1024 d64n1024cudnn; do
    echo "== $t"; zcat "$w/${t}_raw.csv.gz" | head -c 0; zcat "$w/${t}_raw.csv.gz" | head -1 | tr ',' '\n' | grep -i pmsampling | head -20
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
