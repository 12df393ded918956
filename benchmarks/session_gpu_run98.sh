#!/usr/bin/env bash
# Second device call of the sixteenth session (2026-12-02), NOTES §87: Q as the register operand of
# S = Q K^T in the two-warpgroup forwards (hopper.q_in_registers, ab_fwd's "-qr"), with / without, at
# d = 64 / 128, cuDNN in the same run; then its GPU tests.
# Usage: bash benchmarks/session_gpu_run98.sh OUT        (writes OUT/summary.log and OUT/run98.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run98.tar.gz" -C "$w" .; }
{
ab() {  # tag headdim loads timeout
    timeout "$4" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal 0,1 \
        --seqlens 512,2048,16384 --loads "$3" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A8 "^  d c" "$w/$1.log"
    pack
}
ab qr_128 128 gluon-pp-lean-crw,gluon-pp-lean-crw-qr,gluon-pers-lean-crw,gluon-pers-lean-crw-qr 150
ab qr_64 64 gluon-pers-lean,gluon-pers-lean-qr,gluon-pp-lean-crw,gluon-pp-lean-crw-qr,gluon-wg3-crw 150
timeout 150 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider -k "q_in_registers" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
