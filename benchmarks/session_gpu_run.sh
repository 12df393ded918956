#!/usr/bin/env bash
# One device call: the GPU tests (compiled kernels incl. decoding and CUDA-graph capture), a probe of
# host read-back cost, the decode launch sweep, the decode bench against SDPA/flex, and the forward
# A/B (exp2 mode x load path) against SDPA flash/cuDNN in the same process.
# Usage: bash benchmarks/session_gpu_run.sh OUTDIR  (each step has its own time limit)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=. IOATTN_SKIP_AOT=1
mkdir -p "$out/decode"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
  timeout 60 python3 benchmarks/decode_probe.py; } > "$out/env.txt" 2>&1
cat "$out/env.txt"
timeout 110 python3 benchmarks/tune_decode.py --out "$out" > "$out/tune_decode.log" 2>&1
echo "tune_decode rc=$?"; sed -n '/best config/,$p' "$out/tune_decode.log"
timeout 70 python3 -m ioattn bench decode --providers ioattn,ioattn-graph,ioattn-paged,ioattn-unified,sdpa-flash,sdpa-cudnn \
    --out "$out/decode" > "$out/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode/*.png
timeout 110 python3 benchmarks/ab_fwd.py --out "$out" > "$out/ab_fwd.log" 2>&1
echo "ab_fwd rc=$?"; tail -n 13 "$out/ab_fwd.log"
# last: whatever the time limit leaves of the test log still comes back
timeout 230 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gpu.py tests/test_decode.py > "$out/test_gpu.log" 2>&1
echo "pytest rc=$?"; tail -n 6 "$out/test_gpu.log"
