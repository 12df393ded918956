#!/usr/bin/env bash
# Device call G of 2026-12-01 (fifth session): the decode plan with the register cap (WIDE_MAX_REGS):
# (1) the decode plan and tail tests on the GPU; (2) `ioattn bench decode` at batches 17-100 x 4096
# (wave split, tail split, capped launches) with cuDNN, eager and paged.
# Usage: bash benchmarks/session_gpu_run32.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 100 python3 -m pytest tests/test_decode.py tests/test_gpu.py -k "plan or tail or kvcache or paged_load" -n 8 -q \
    -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
mkdir -p "$out/decode_batches"
timeout 150 python3 -m ioattn bench decode --out "$out/decode_batches" --batches 17,24,34,42,48,68,100 --kvlens 4096 \
    --providers ioattn,ioattn-paged,sdpa-cudnn > "$out/decode_batches/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode_batches/*.png
grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
python3 - "$out/decode_batches/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
names = list(dict.fromkeys(r["provider"] for r in rows))
print("batch  kvlen " + " ".join(f"{n:>14}" for n in names))
for case in dict.fromkeys((r["batch"], r["seqlen_k"]) for r in rows):
    us = {r["provider"]: r["ms"] * 1e3 for r in rows if (r["batch"], r["seqlen_k"]) == case and r.get("ms")}
    print(f"{case[0]:>5} {case[1]:>6} " + " ".join(f"{us.get(n, float('nan')):>14.1f}" for n in names))
PY
