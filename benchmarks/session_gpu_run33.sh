#!/usr/bin/env bash
# Device call A of 2026-12-01 (sixth session): NOTES §42, exp2 on the FMA units in the Gluon forward.
# (1) its GPU tests (88: float64 oracle, ragged, no-key rows, extreme logits, the lse against the
# default kernel); (2) ab_fwd at d=64 (ping-pong and wg3) and d=128 (ping-pong) at 0 / 12.5 / 25 / 50 %,
# three interleaved rounds, with the SM clock and power sampled every 100 ms beside it (is the
# forward's run-to-run spread, §18 / §36, a clock or power effect?).
# Usage: bash benchmarks/session_gpu_run33.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
bash benchmarks/smi_log.sh "$out/smi.csv" 100 &
smi=$!
timeout 210 python3 -m pytest tests/test_gpu.py -k exp2_fma -n 8 -q -p no:cacheprovider -rfE > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
date +"ab64 start %T" >> "$out/ab.log"
timeout 180 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_fma64 --headdims 64 --seqlens 4096,16384 --causal 0,1 \
    --rounds 3 --loads gluon-pp,gluon-pp-fma12,gluon-pp-fma25,gluon-pp-fma50,gluon-wg3,gluon-wg3-fma12,gluon-wg3-fma25,gluon-wg3-fma50 \
    >> "$out/ab.log" 2>&1
echo "ab64 rc=$?"
date +"ab128 start %T" >> "$out/ab.log"
timeout 130 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_fma128 --headdims 128 --seqlens 4096,16384 --causal 0,1 \
    --rounds 3 --loads gluon-pp,gluon-pp-fma12,gluon-pp-fma25,gluon-pp-fma50 >> "$out/ab.log" 2>&1
echo "ab128 rc=$?"
date +"end %T" >> "$out/ab.log"
kill $smi 2>/dev/null
python3 - "$out" <<'PY'
import json, sys, os, statistics
out = sys.argv[1]
smi = [l.split(", ") for l in open(os.path.join(out, "smi.csv")) if l.count(",") >= 5]
try:
    sm = [float(r[1].split()[0]) for r in smi]; pw = [float(r[3].split()[0]) for r in smi]
    print(f"smi samples {len(smi)}: SM clock min/median/max {min(sm):.0f}/{statistics.median(sm):.0f}/{max(sm):.0f} MHz, "
          f"power max {max(pw):.0f} W; reasons seen {sorted({r[5].strip() for r in smi})}")
except Exception as e:
    print("smi parse:", e)
for tag in ("ab_fma64", "ab_fma128"):
    p = os.path.join(out, tag + ".jsonl")
    if not os.path.exists(p):
        continue
    rows = [json.loads(l) for l in open(p)]
    names = list(dict.fromkeys(r["variant"] for r in rows))
    print(tag + ": TFLOP/s (median of rounds; spread of rounds in % of it)")
    print("c     N " + " ".join(f"{n.replace('gluon-','').replace('-dflt',''):>11}" for n in names))
    for key in dict.fromkeys((r["causal"], r["seqlen"]) for r in rows):
        cell = {r["variant"]: r for r in rows if (r["causal"], r["seqlen"]) == key}
        def f(r):
            if not r["ok"]:
                return "FAIL"
            sp = (max(r["ms_rounds"]) - min(r["ms_rounds"])) / r["ms"] * 100 if r["ms_rounds"] else 0
            return f"{r['tflops']:.0f}/{sp:.1f}"
        print(f"{int(key[0])} {key[1]:>5} " + " ".join(f"{f(cell[n]):>11}" for n in names))
PY
