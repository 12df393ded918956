#!/usr/bin/env bash
# Device call F of 2026-12-01 (sixth session): `ioattn bench decode` with the merge released after the
# split programs' key loop (the new default, NOTES §44): the table (3 interleaved rounds) and the
# off-table batches 17 / 68 / 100 x 4096, against cuDNN, eager / graph / paged.
# Usage: bash benchmarks/session_gpu_run38.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$out/decode" "$out/decode_batches"
timeout 240 python3 -m ioattn bench decode --out "$out/decode" --providers ioattn,ioattn-paged,sdpa-cudnn \
    > "$out/decode/decode.log" 2>&1
echo "decode rc=$?"
timeout 150 python3 -m ioattn bench decode --out "$out/decode_batches" --batches 17,68,100 --kvlens 4096 \
    --providers ioattn,ioattn-paged,sdpa-cudnn > "$out/decode_batches/decode.log" 2>&1
echo "batches rc=$?"; rm -f "$out"/decode*/*.png
for f in "$out/decode/results.jsonl" "$out/decode_batches/results.jsonl"; do
python3 - "$f" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
names = list(dict.fromkeys(r["provider"] for r in rows))
print("batch  kvlen " + " ".join(f"{n:>13}" for n in names) + "  cudnn/ioattn  rounds (ioattn | cudnn)")
for case in dict.fromkeys((r["batch"], r["seqlen_k"]) for r in rows):
    cell = {r["provider"]: r for r in rows if (r["batch"], r["seqlen_k"]) == case and r.get("ms")}
    us = {n: cell[n]["ms"] * 1e3 for n in cell}
    rr = lambda n: "/".join(f"{x * 1e3:.1f}" for x in cell[n].get("ms_rounds", [])) if n in cell else "-"
    ratio = us.get("sdpa-cudnn", float("nan")) / us.get("ioattn", float("nan"))
    print(f"{case[0]:>5} {case[1]:>6} " + " ".join(f"{us.get(n, float('nan')):>13.1f}" for n in names)
          + f"  {ratio:12.3f}  {rr('ioattn')} | {rr('sdpa-cudnn')}")
PY
done
