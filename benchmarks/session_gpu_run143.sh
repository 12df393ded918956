#!/usr/bin/env bash
# NOTES §115: (1) the d = 64 persistent kernel's deferred row sum (`-ds`) against the default again,
# 3 rounds, N = 512 ... 4096, both masks (§114 measured +1.2 to +2.5 % at four of six points, -0.8 % at
# one); (2) the short forward's stalls by SASS instruction (ncu source counters, exported as CSV) at
# the grid points still below cuDNN: d = 64 N = 512 non-causal and causal, d = 128 N = 512 causal.
# Usage: bash benchmarks/session_gpu_run143.sh OUT        (writes OUT/summary.log and OUT/run143.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run143.tar.gz" -C "$w" .; }
{
p64=gluon-pers-lean
timeout 150 python3 benchmarks/ab_fwd.py --out "$w" --tag fwd64ds --headdims 64 --causal 0,1 \
    --seqlens 512,1024,2048,4096 --loads $p64,$p64-ds --rounds 3 --rest 0.2 > "$w/fwd64ds.log" 2>&1
echo "fwd64ds rc=$?"; grep -E "Error|error" "$w/fwd64ds.log" | head -4; grep -A10 "^  d c" "$w/fwd64ds.log"
pack
for spec in "64:" "64:--causal" "128:--causal"; do
    d=${spec%%:*}; c=${spec#*:}
    tag="src512d${d}${c:+c}"
    timeout 100 ncu --clock-control none --kernel-name regex:hopper_fwd --launch-skip 2 --launch-count 1 \
        --section WarpStateStats --section SourceCounters -f -o "$w/$tag" \
        python3 benchmarks/ncu_fwd.py --variants persistent --seqlen 512 --headdim $d $c > "$w/ncu_$tag.log" 2>&1
    echo "ncu $tag rc=$?"; tail -n 1 "$w/ncu_$tag.log"
    ncu -i "$w/$tag.ncu-rep" --page source --csv --print-source sass > "$w/${tag}_sass.csv" 2>&1
    echo "export rc=$? $(wc -c < "$w/${tag}_sass.csv") bytes"; gzip -f "$w/${tag}_sass.csv"; rm -f "$w/$tag.ncu-rep"
    pack
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
