#!/usr/bin/env bash
# NOTES §142: layouts with no (rows, heads * d) view (q, k, v transposed from (batch, heads, seqlen,
# d)): the GPU tests of the copy path and of its refusal, then the train sweep with --layout bhnd twice,
# the Gluon kernels on contiguous copies at every length (IOATTN_HOPPER_COPY=1) and the portable
# kernels (=0), cuDNN in each run: the data for hopper.COPY_MIN_SEQLEN.
# Usage: bash benchmarks/session_gpu_run191.sh OUT        (writes OUT/summary.log and OUT/run191.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run191.tar.gz" -C "$w" .; }
sweep() {  # tag IOATTN_HOPPER_COPY
    t0=$(date +%s)  # about 150 s for the full grid (run188); here 5 of its 6 lengths
    IOATTN_HOPPER_COPY=$2 timeout 230 python3 -m ioattn bench train --layout bhnd --headdims 64,128,256 \
        --seqlens 512,1024,2048,4096,16384 --providers ioattn,sdpa-cudnn --out "$w/$1" > "$w/$1.log" 2>&1
    echo "sweep $1 rc=$? $(( $(date +%s) - t0 ))s"; rm -f "$w/$1"/*.png
    sed -n '/== train sweep/,$p' "$w/$1.log" | grep -E " (fwd|bwd) " | head -n 80
    pack
}
{
t0=$(date +%s)
timeout 100 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "layout_without_a_view" \
    > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
sweep bhnd-copy 1
sweep bhnd-portable 0
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
