#!/usr/bin/env bash
# Nineteenth session (NOTES §99): the backward's flat dQ tile (WS_DQ_FLAT, ab_bwd "gluon-ws-dqflat").
# (1) its GPU tests (float64 oracle, every shape of the backward suite; the deterministic mode);
# (2) ab_bwd against the swizzled tile (the default) and cuDNN, d = 64 / 128, 3 rounds;
# (3) its L2 counters under Nsight Compute at d = 128, N = 4096 causal (run116 has the default's).
# Usage: bash benchmarks/session_gpu_run117.sh OUT        (OUT/summary.log, OUT/run117.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run117.tar.gz" -C "$w" .; }
{
timeout 170 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider -k "flat" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8; pack
timeout 250 python3 benchmarks/ab_bwd.py --out "$w" --tag flat --headdims 128,64 --seqlens 1024,4096,16384 \
    --providers gluon-ws,gluon-ws-dqflat,sdpa-cudnn --rounds 3 > "$w/flat.log" 2>&1
echo "ab rc=$?"; grep -E "Error|error|FAIL" "$w/flat.log" | head -4; grep -A14 "^  d c" "$w/flat.log"; pack
timeout 90 ncu --clock-control none --nvtx --nvtx-include "ioattn-d128/" --kernel-name regex:hopper_bwd \
    --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section WarpStateStats -f -o "$w/flatc" \
    python3 benchmarks/ncu_bwd.py --headdims 128 --seqlen 4096 --causal --dq-flat > "$w/ncu_flatc.log" 2>&1
echo "ncu rc=$?"; tail -n 1 "$w/ncu_flatc.log"
ncu -i "$w/flatc.ncu-rep" --page raw --csv > "$w/ncu_flatc_raw.csv" 2>&1
ncu -i "$w/flatc.ncu-rep" --page details > "$w/ncu_flatc_details.txt" 2>&1; rm -f "$w/flatc.ncu-rep"
grep -E "Duration|L2 Cache Thr|L1/TEX Cache|Compute \(SM\) Thr|Warp Cycles Per Issued" "$w/ncu_flatc_details.txt"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
