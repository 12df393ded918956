#!/usr/bin/env bash
# NOTES §141, part 2: the train sweep with packed inputs (--layout qkvpacked) on the library as it was
# before the Gluon kernels read packed views in place: ioattn/ with dispatch.py, hopper.py and
# kernels/hopper_backward.py from the parent of that change (copied to prev/ioattn, carried to the
# device, never committed), cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run189.sh OUT        (writes OUT/summary.log and OUT/run189.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1
cd prev || exit 1  # python -m puts the working directory first on sys.path: run from prev/
pack() { tar -czf "$out/run189.tar.gz" -C "$w" .; }
{
python3 -c "import ioattn, ioattn.hopper as h; print(ioattn.__file__, hasattr(ioattn.dispatch, 'tma_rows_view'))"
t0=$(date +%s)
timeout 300 python3 -m ioattn bench train --layout qkvpacked --headdims 64,128,256 --providers ioattn,sdpa-cudnn \
    --out "$w/packed-before" > "$w/packed-before.log" 2>&1
echo "sweep before rc=$? $(( $(date +%s) - t0 ))s"; rm -f "$w"/packed-before/*.png
sed -n '/== train sweep/,$p' "$w/packed-before.log" | grep -E " (fwd|bwd) " | head -n 80
pack
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
