#!/usr/bin/env bash
# NOTES §129, the pass on by default (hopper.ptx_barriers): (1) the forward's GPU tests as the library
# runs them now (every variant's bf16 shapes, the persistent tile loop, the diagonal trim, the mask
# branch, the unmasked keys, the default dispatch); (2) compute-sanitizer racecheck at the small shape,
# d = 64 (every forward variant; the persistent one with several tiles a program); (3) in-process A/Bs,
# without / with the pass, cuDNN in the same process: d = 256 persistent N = 512 / 2048 both masks, wg3
# d = 64 N = 2048 / 16384 both masks (checked at 2048).
# Usage: bash benchmarks/session_gpu_run169.sh OUT        (writes OUT/summary.log and OUT/run169.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run169.tar.gz" -C "$w" .; }
ab() {  # tag headdims causal seqlens loads timeout
    t0=$(date +%s)
    timeout "$6" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 3 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$? $(( $(date +%s) - t0 ))s"; grep -A8 "^  d c" "$w/$1.log"; grep -i "error\|fail" "$w/$1.log" | head -4
    pack
}
{
t0=$(date +%s)
timeout 270 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "(hopper_forward and dtype0 and not varlen \
and not extreme and not exp2 and not registers) or persistent_tile_loop or diag_trim or default_dispatch or mask_branch \
or unmasked_keys" > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
t0=$(date +%s)
timeout 150 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_small.py --heads 64 \
    > "$w/sanitizer_racecheck_fwd.log" 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/sanitizer_racecheck_fwd.log")"
grep -E "^=========\s+(Error|Warning).*" "$w/sanitizer_racecheck_fwd.log" | sort | uniq -c | head -8
pack
ab ab256 256 0,1 512,2048 gluon-pers-lean-crw-ds-nopb,gluon-pers-lean-crw-ds 90
ab wg3nc 64 0 2048,16384 gluon-wg3-crw-ds-nopb,gluon-wg3-crw-ds 70
ab wg3c 64 1 2048,16384 gluon-wg3-crw-nopb,gluon-wg3-crw 70
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
