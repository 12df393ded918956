#!/usr/bin/env bash
# Next device session, first call (benchmarks/NOTES.md, "Plan for the next device session"):
# (1) the GPU tests with the Gluon ping-pong forward as the d=128 default and the PDL decode tests;
# (2) `ioattn bench decode` with ioattn-pdl / ioattn-graph-pdl beside ioattn / ioattn-graph and the peers;
# (3) the forward A/B: portable TMA, conditional rescaling (tau 8), Gluon ping-pong and split;
# (4) compute-sanitizer memcheck and racecheck on one small call of each kernel family.
# The train sweep with every provider (issue 3) is its own call: benchmarks/session_gpu_run9.sh.
# Usage: bash benchmarks/session_gpu_run8.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 -m pytest tests/test_gpu.py tests/test_decode.py tests/test_merge.py -n 6 -q -p no:cacheprovider \
    -rfEs -k "not hopper_backward" > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 2 "$out/test_gpu.log"
# the Gluon backward's first run, on its own (a wrong barrier would hang it)
timeout 60 python3 -m pytest tests/test_gpu.py -k hopper_backward -n 6 -q -p no:cacheprovider -rfE \
    > "$out/test_hopper_bwd.log" 2>&1
echo "hopper bwd tests rc=$?"; tail -n 2 "$out/test_hopper_bwd.log"
mkdir -p "$out/decode"
timeout 150 python3 -m ioattn bench decode --out "$out/decode" > "$out/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode/*.png
timeout 110 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_fwd --loads tma,tma-r8,gluon-pp,gluon-split \
    --headdims 64,128,256 --seqlens 512,2048,16384 > "$out/ab_fwd.log" 2>&1
echo "ab rc=$?"
for tool in memcheck racecheck; do  # issue 5: the Hopper kernels clean under compute-sanitizer
    timeout 60 compute-sanitizer --tool $tool python3 benchmarks/sanitize_small.py > "$out/sanitizer_$tool.log" 2>&1
    echo "sanitizer $tool rc=$?"; tail -n 2 "$out/sanitizer_$tool.log"
done
grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 6
grep -E "^ioattn(-pdl|-graph|-graph-pdl)? |^sdpa-cudnn" "$out/decode.log" | tail -n 12
tail -n 21 "$out/ab_fwd.log"
