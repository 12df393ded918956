#!/usr/bin/env bash
# Prepared in the twentieth session for the next one (NOTES plan, item 1): where the d = 128 backward's
# time goes now that each consumer warpgroup is a partition of its own (§105): its stalls by SASS
# instruction (ncu source counters, exported as CSV, as §100's run120) at N = 4096, non-causal and causal,
# with the dispatch's defaults. The question: is the dS^T exchange (the wait on the count-2 barrier) now
# the step's join, and what do the warpgroups do while they wait.
# Usage: bash benchmarks/session_gpu_run131.sh OUT        (writes OUT/summary.log and OUT/run131.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run131.tar.gz" -C "$w" .; }
{
for mask in noncausal causal; do
    flag=""; [ "$mask" = causal ] && flag="--causal"
    timeout 200 ncu --clock-control none --nvtx --nvtx-include "ioattn-d128/" --kernel-name regex:hopper_bwd \
        --section WarpStateStats --section SourceCounters -f -o "$w/src_$mask" \
        python3 benchmarks/ncu_bwd.py --headdims 128 --seqlen 4096 $flag > "$w/ncu_src_$mask.log" 2>&1
    echo "ncu $mask rc=$?"; tail -n 1 "$w/ncu_src_$mask.log"
    ncu -i "$w/src_$mask.ncu-rep" --page source --csv --print-source sass > "$w/ncu_src_sass_$mask.csv" 2>&1
    echo "export rc=$? $(wc -c < "$w/ncu_src_sass_$mask.csv") bytes"
    gzip -f "$w/ncu_src_sass_$mask.csv"; rm -f "$w/src_$mask.ncu-rep"
    pack
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
