#!/usr/bin/env bash
# Third device call of the session: the GPU tests with the final defaults, then the committed sweeps:
# train (bf16, d = 64/128/256, SDPA flash/cuDNN/efficient in the same run), memory, decode (all
# providers), and train fp16 for d = 64/128 if time is left. Usage: bash benchmarks/session_gpu_run3.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=. IOATTN_SKIP_AOT=1
mkdir -p "$out/train" "$out/memory" "$out/decode" "$out/train16"
log="$out/steps.log"
xdist=""; python3 -c "import xdist" 2>/dev/null && xdist="-n 6"
timeout 110 python3 -m pytest -q -p no:cacheprovider $xdist -rfE tests/test_gpu.py tests/test_decode.py tests/test_merge.py \
    > "$out/test_gpu.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$out/test_gpu.log"
timeout 190 python3 -m ioattn bench train --providers ioattn,sdpa-flash,sdpa-cudnn,sdpa-efficient --out "$out/train" >> "$log" 2>&1
echo "train rc=$?"
timeout 50 python3 -m ioattn bench memory --out "$out/memory" >> "$log" 2>&1
echo "memory rc=$?"
timeout 60 python3 -m ioattn bench decode --out "$out/decode" >> "$log" 2>&1
echo "decode rc=$?"
grep -E "^(ioattn|sdpa)[a-z-]* +decode" "$log" | awk '{print $1, $4, $5, $6, $7, $8}' | grep -v "sdpa-math\|checked"
timeout 75 python3 -m ioattn bench train --dtype fp16 --headdims 64,128 --providers ioattn,sdpa-flash,sdpa-cudnn \
    --out "$out/train16" >> "$log" 2>&1
echo "train16 rc=$?"
rm -f "$out"/*/*.png
