#!/usr/bin/env bash
# Device call E of 2026-12-01 (fourth session): (1) GPU tests of the Gluon forward's default dispatch
# (the persistent variant for short non-causal calls); (2) `ioattn bench train` at head dims
# 64/128/256 with the defaults, SDPA flash and cuDNN in the same run (issue 5's grid); (3)
# ab_decode --cases wide --rounds 2 (key chunk and stages without splits).
# Usage: bash benchmarks/session_gpu_run22.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 90 python3 -m pytest tests/test_gpu.py -k "default_policy or persistent or explain" -n 8 -q \
    -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
mkdir -p "$out/train"
timeout 330 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-flash,sdpa-cudnn \
    --out "$out/train" > "$out/train/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
timeout 100 python3 benchmarks/ab_decode.py --out "$out" --cases wide --rounds 2 > "$out/ab_decode_wide.log" 2>&1
echo "ab_decode rc=$?"
grep -E "FAILED|ERROR|Timeout" "$out/test_gpu.log" | head -n 8
grep -A 12 "median over rounds" "$out/ab_decode_wide.log"
python3 - "$out/train/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("mode d c      N   ioattn    cudnn  ratio")
for r in rows:
    if r["provider"] != "ioattn":
        continue
    peer = [p for p in rows if p["provider"] == "sdpa-cudnn" and all(p[k] == r[k] for k in
            ("mode", "headdim", "causal", "seqlen_q"))]
    c = peer[0]["tflops"] if peer else float("nan")
    print(f"{r['mode']:>4} {r['headdim']:>3} {int(r['causal'])} {r['seqlen_q']:>6} {r['tflops']:8.0f} {c:8.0f} "
          f"{r['tflops'] / c:6.2f}{'' if r['ok'] else ' NOT OK'}")
PY
