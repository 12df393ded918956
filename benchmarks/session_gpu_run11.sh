#!/usr/bin/env bash
# Next device session (benchmarks/NOTES.md, "Plan for the next device session"), one call:
# (1) the new Gluon kernels' GPU tests on their own first (a barrier mistake would hang): the
#     warp-specialised backward (variant ws) and the three-warpgroup forward (variant wg3);
# (2) the rest of the GPU tests; (3) `ioattn bench decode` (§21's tile split, §23, §24);
# (4) backward A/B with gluon-ws (§22); (5) forward A/B with gluon-wg3 at d=64 (§25);
# (6) racecheck on the warp-specialisation controls, plain and with a partition-local barrier (§21).
# Usage: bash benchmarks/session_gpu_run11.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 100 python3 -m pytest tests/test_gpu.py -k "hopper_backward and ws or hopper_forward and wg3 or negative_scale or hopper_forward_varlen or through_the_api" -n 14 -q \
    -p no:cacheprovider -rfE > "$out/test_gpu_new.log" 2>&1
echo "new kernels' tests rc=$?"; tail -n 1 "$out/test_gpu_new.log"
timeout 180 python3 -m pytest tests/test_gpu.py tests/test_decode.py tests/test_merge.py -n 14 -q -p no:cacheprovider \
    -rfEs -k "not (hopper_backward and ws) and not (hopper_forward and wg3) and not negative_scale and not hopper_forward_varlen and not through_the_api" > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"
mkdir -p "$out/decode"
timeout 100 python3 -m ioattn bench decode --out "$out/decode" > "$out/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode/*.png
timeout 80 python3 benchmarks/ab_bwd.py --out "$out" --providers portable,gluon,gluon-ws,sdpa-cudnn \
    --seqlens 4096,16384 > "$out/ab_bwd.log" 2>&1
echo "ab_bwd rc=$?"
timeout 50 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_fwd --loads tma,gluon-pp,gluon-wg3 --headdims 64 \
    --seqlens 2048,16384 > "$out/ab_fwd.log" 2>&1
echo "ab_fwd rc=$?"
for flag in "" --local-barrier; do
    timeout 30 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_ws_control.py $flag 2>&1 | tail -n 1
done
grep -E "FAILED|ERROR" "$out/test_gpu_new.log" "$out/test_gpu.log" | head -n 6
grep -E "^(ioattn|ioattn-paged|ioattn-graph|sdpa-cudnn) " "$out/decode.log" | tail -n 28
tail -n 9 "$out/ab_bwd.log"; tail -n 5 "$out/ab_fwd.log"
