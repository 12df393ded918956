#!/usr/bin/env bash
# NOTES §129: the consumers' partition barriers dropped from the forward's PTX (hopper.ptx_barriers,
# ab_fwd suffix "-pb"). Part 1: (1) the device's ptxas; (2) the GPU tests of the pass (every
# ping-pong variant, head dim and mask; poisoned outputs, gradients); (3) in-process A/Bs, default
# build / the same with the pass, cuDNN in the same process: d = 64 both masks N = 512-2048 (the
# persistent kernel), d = 128 causal N = 512 / 1024. Part 2: the same A/Bs again in new processes, and
# the long-length defaults (ping-pong d = 128, wg3 d = 64, N = 16384).
# Usage: bash benchmarks/session_gpu_run168.sh OUT PART   (writes OUT/summary.log and OUT/run168.tar.gz)
set -u
out=${1:?outdir}; part=${2:?part}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run168.tar.gz" -C "$w" .; }
ab() {  # tag headdims causal seqlens loads timeout
    t0=$(date +%s)
    timeout "$6" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$? $(( $(date +%s) - t0 ))s"; grep -A8 "^  d c" "$w/$1.log"; grep -i "error\|fail" "$w/$1.log" | head -4
    pack
}
{
if [ "$part" = 1 ]; then
    python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from gluon_aot import ptxas_version; print('ptxas:', ptxas_version())"
    t0=$(date +%s)
    timeout 240 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "ptx_barriers" \
        > "$w/tests.log" 2>&1
    echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
    grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
    pack
    ab ab64_1 64 0,1 512,1024,2048 gluon-pers-lean-ds,gluon-pers-lean-ds-pb 150
    ab ab128_1 128 1 512,1024 gluon-pers-lean-crw-qr-ds,gluon-pers-lean-crw-qr-ds-pb 100
else
    ab ab64_2 64 0,1 512,1024,2048 gluon-pers-lean-ds-pb,gluon-pers-lean-ds 150
    ab ab128_2 128 1 512,1024 gluon-pers-lean-crw-qr-ds-pb,gluon-pers-lean-crw-qr-ds 100
    ab long128 128 0 16384 gluon-pp-lean-crw-qr-ds,gluon-pp-lean-crw-qr-ds-pb 100
    ab long64 64 0 16384 gluon-wg3-crw-ds,gluon-wg3-crw-ds-pb 100
fi
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
