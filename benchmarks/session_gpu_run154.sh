#!/usr/bin/env bash
# NOTES §121, third run: without the mask branch ptxas hoists the wait for P(i) V(i) above the softmax
# (the SASS of every -um build). benchmarks/patches/early_kv_waits.diff waits for the next section's
# K / V readiness right after the softmax (a control-flow join there: ptxas does not move the P V
# wait above it); in the d = 64 persistent and d = 128 ping-pong builds the wait then follows the
# softmax's exponentials (in the d = 128 / 256 persistent and wg3 builds ptxas sinks the exponentials
# below the join instead). The same A/B (each head dim's default build without / with -um) first on
# the committed kernel, then on the patched one (its GPU tests first), cuDNN in every process.
# Usage: bash benchmarks/session_gpu_run154.sh OUT        (writes OUT/summary.log and OUT/run154.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run154.tar.gz" -C "$w" .; }
ab() {  # tag headdim causal seqlens loads
    timeout 120 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A4 "^  d c" "$w/$1.log"
    pack
}
set4() {  # suffix
    ab "x64$1" 64 0 512,1024 "gluon-pers-lean-ds,gluon-pers-lean-ds-um"
    ab "x128$1" 128 0 512,2048,16384 "gluon-pers-lean-crw-qr-ds,gluon-pers-lean-crw-qr-ds-um,gluon-pp-lean-crw-qr-ds,gluon-pp-lean-crw-qr-ds-um"
    ab "x64w$1" 64 0 2048,16384 "gluon-wg3-crw-ds,gluon-wg3-crw-ds-um"
}
{
set4 A
(git apply benchmarks/patches/early_kv_waits.diff || patch -p1 < benchmarks/patches/early_kv_waits.diff) && grep -c "nk = g0 + i + 2" ioattn/kernels/hopper_forward.py && echo "patched"
timeout 100 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "unmasked_keys" > "$w/testsB.log" 2>&1
echo "tests (patched) rc=$?: $(tail -n 1 "$w/testsB.log")"
grep -E "^(FAILED|ERROR)" "$w/testsB.log" | head -8
set4 B
git apply -R benchmarks/patches/early_kv_waits.diff || patch -R -p1 < benchmarks/patches/early_kv_waits.diff
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
