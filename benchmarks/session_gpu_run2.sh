#!/usr/bin/env bash
# Second device call of the session: GPU tests (forward with TMA by default, decode, merge), the decode
# launch sweep after the merge rewrite, the decode bench, a forward tile A/B at N = 4096/8192, and the
# train sweep (d = 64/128) against SDPA flash/cuDNN. Usage: bash benchmarks/session_gpu_run2.sh OUTDIR
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=. IOATTN_SKIP_AOT=1
mkdir -p "$out/decode" "$out/train"
log="$out/steps.log"
xdist=""; python3 -c "import xdist" 2>/dev/null && xdist="-n 6"
echo "xdist: ${xdist:-none}"
timeout 220 python3 -m pytest -q -p no:cacheprovider $xdist -rfE tests/test_gpu.py tests/test_decode.py tests/test_merge.py \
    > "$out/test_gpu.log" 2>&1
echo "pytest rc=$?"; tail -n 5 "$out/test_gpu.log"
timeout 80 python3 benchmarks/tune_decode.py --out "$out" >> "$log" 2>&1
echo "tune_decode rc=$?"; sed -n '/best config/,$p' "$log"
timeout 70 python3 -m ioattn bench decode --out "$out/decode" >> "$log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode/*.png
grep -E "^(ioattn|sdpa)[a-z-]* +decode" "$log" | awk '{print $1, $4, $5, $6, $7, $8}'
timeout 80 python3 benchmarks/ab_fwd.py --out "$out" --seqlens 4096,8192 --tiles "default;128,128,8,2;64,128,4,3" >> "$log" 2>&1
echo "ab_fwd rc=$?"; sed -n '/best\/flash/,$p' "$log"
timeout 110 python3 -m ioattn bench train --headdims 64,128 --providers ioattn,ioattn-ptr,sdpa-flash,sdpa-cudnn \
    --out "$out/train" >> "$log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
