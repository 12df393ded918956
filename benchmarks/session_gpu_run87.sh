#!/usr/bin/env bash
# Fourth device call of the fourteenth session (2026-12-02), NOTES §78: the one-wave decode launch
# (64-key chunks, 2 stages, registers capped at 128, for 3-4 programs an SM) made the default.
# (1) GPU tests of decode (the new launch against the float64 oracle, the policy test); (2) `ioattn
# bench decode` (issue 4's table, cuDNN in the same run); (3) ab_decode --cases onewave (batches 50-56
# with the one-wave launch instead of the tail split; batch 80 with 5 programs an SM).
# Usage: bash benchmarks/session_gpu_run87.sh OUT        (writes OUT/summary.log and OUT/run87.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w/decode"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 150 python3 -m pytest -q -x -n 8 tests/test_gpu.py -p no:cacheprovider -k "decode" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
timeout 200 python3 -m ioattn bench decode --out "$w/decode" --providers ioattn,ioattn-graph,ioattn-paged,sdpa-cudnn \
    > "$w/decode/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$w"/decode/*.png
python3 benchmarks/decode_table.py "$w/decode/results.jsonl"
timeout 150 python3 benchmarks/ab_decode.py --out "$w" --cases onewave --rounds 3 > "$w/onewave.log" 2>&1
echo "onewave rc=$?"; sed -n '/median over rounds/,$p' "$w/onewave.log"
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run87.tar.gz" -C "$w" . && rm -rf "$w"
