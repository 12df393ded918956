#!/usr/bin/env bash
# Device call C of 2026-12-01 (sixth session), SM clock and power sampled every 50 ms:
# (1) the decode step's device timeline (benchmarks/decode_timeline.py): ioattn eager and graph replay
# against cuDNN at batch 1 x 4k / 16k / 64k and 8 x 8192 (kernels, durations, gaps);
# (2) ab_fwd, persistent vs one-tile ping-pong at d=128 / 256, N = 4096 / 8192 / 16384, non-causal,
# 3 interleaved rounds with 0.3 s of rest before each timing (power-limiter state equal for all).
# Usage: bash benchmarks/session_gpu_run35.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
bash benchmarks/smi_log.sh "$out/smi.csv" 50 &
smi=$!
timeout 150 python3 benchmarks/decode_timeline.py --out "$out/decode_timeline.json" \
    --providers ioattn,ioattn-graph,sdpa-cudnn > "$out/decode_timeline.log" 2>&1
echo "timeline rc=$?"
timeout 240 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_pers --headdims 128,256 --seqlens 4096,8192,16384 \
    --causal 0 --rounds 3 --rest 0.3 --loads gluon-pp,gluon-pers > "$out/ab_pers.log" 2>&1
echo "ab rc=$?"
kill $smi 2>/dev/null
cat "$out/decode_timeline.log" | head -n 60
python3 - "$out/ab_pers.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
names = list(dict.fromkeys(r["variant"] for r in rows))
print("  d     N " + " ".join(f"{n.replace('gluon-','').replace('-dflt',''):>16}" for n in names))
for key in dict.fromkeys((r["headdim"], r["seqlen"]) for r in rows):
    cell = {r["variant"]: r for r in rows if (r["headdim"], r["seqlen"]) == key}
    f = lambda r: f"{r['tflops']:.0f} ({'/'.join(f'{x:.2f}' for x in r['ms_rounds'])})" if r["ok"] else "FAIL"
    print(f"{key[0]:>3} {key[1]:>5} " + " ".join(f"{f(cell[n]):>16}" for n in names))
PY
