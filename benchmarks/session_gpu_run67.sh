#!/usr/bin/env bash
# Second device call of the eleventh session (2026-12-02): NOTES §62's fewer masked key tiles
# (its GPU tests and its d = 128 A/B, as prepared for it in the tenth session), then compute-sanitizer memcheck on
# sanitize_small.py with a longer limit (run63's 110 s ran out before the first report).
# Usage: bash benchmarks/session_gpu_run67.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 140 python3 -m pytest tests/test_gpu.py -k "fewer_masks" -n 16 -v -p no:cacheprovider -rfE \
    > "$out/test_gpu_fm.log" 2>&1
echo "tests rc=$?"; grep -c " PASSED " "$out/test_gpu_fm.log"; tail -n 1 "$out/test_gpu_fm.log"
grep -E " FAILED | ERROR " "$out/test_gpu_fm.log" | head -n 5
timeout 200 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_fm128 --headdims 128 --seqlens 512,1024,2048,16384 \
    --loads tma,gluon-pp-lean,gluon-pp-lean-fm,gluon-pers-lean,gluon-pers-lean-fm --rounds 2 --rest 0.1 \
    > "$out/ab_fm128.log" 2>&1
echo "ab rc=$?"; tail -n 10 "$out/ab_fm128.log"
timeout 230 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py > "$out/sanitizer_memcheck.log" 2>&1
echo "sanitizer memcheck rc=$?"; tail -n 2 "$out/sanitizer_memcheck.log"
