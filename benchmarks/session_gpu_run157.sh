#!/usr/bin/env bash
# NOTES §122: warpgroup 0's causal diagonal trimmed in the persistent kernel (hopper.diag_trim, A/B
# suffix -dt), against the default build, causal, d = 128 / 64 / 256; ab_fwd, 3 interleaved rounds,
# cuDNN in the same process. Phase 1: the GPU tests of the option, then one process per head dim;
# phase 2: a second process per head dim (the A/B's sign is decided in alternating processes).
# Usage: bash benchmarks/session_gpu_run157.sh OUT PHASE   (writes OUT/summary.log and OUT/run157.tar.gz)
set -u
out=${1:?outdir}
phase=${2:?phase}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run157.tar.gz" -C "$w" .; }
ab() {  # tag headdim seqlens loads
    local t0=$(date +%s)
    timeout 170 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal 1 --seqlens "$3" \
        --loads "$4" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$? $(( $(date +%s) - t0 ))s"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A5 "^  d c" "$w/$1.log"
    pack
}
# the default causal builds (hopper._lean_bits): d = 128 lean + conditional rescale by warp + Q in
# registers + deferred sum (+ mask branch, the launcher's default); d = 64 lean + deferred sum; d = 256
# lean + conditional rescale by warp + deferred sum
L128="gluon-pers-lean-crw-qr-ds"; L64="gluon-pers-lean-ds"; L256="gluon-pers-lean-crw-ds"
{
if [ "$phase" = 1 ]; then
    t0=$(date +%s)
    timeout 240 python3 -m pytest -q -n 8 tests/test_gpu.py -k "diag_trim" > "$w/tests.log" 2>&1
    echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -1 "$w/tests.log")"
    grep -E "^FAILED|Error" "$w/tests.log" | head -8
    pack
    ab dt128a 128 512,1024,2048,4096 "$L128-dt,$L128"
    ab dt64a 64 512,1024,2048,4096 "$L64-dt,$L64"
    ab dt256a 256 512,1024,2048 "$L256-dt,$L256"
else
    ab dt128b 128 512,1024,2048 "$L128,$L128-dt"
    ab dt64b 64 512,1024,2048 "$L64,$L64-dt"
    ab dt256b 256 512,1024 "$L256,$L256-dt"
fi
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
