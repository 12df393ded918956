#!/usr/bin/env bash
# Third device call of the seventeenth session (2026-12-02), after NOTES §90's decision (the row sum's
# quad reduction once a tile on by default in the ping-pong kernel at d = 128 / 256 and the persistent
# one at d = 256): (1) the option's GPU tests (now wg3 non-causal too), the default dispatch's and the
# persistent tile loop's; (2) ab_fwd with / without it where the policy has not decided: wg3 at d = 64
# non-causal (the default from N = 2048), the persistent kernel at d = 128 over its policy range;
# (3) memcheck at d = 256 (its default kernels now with the option).
# Usage: bash benchmarks/session_gpu_run102.sh OUT        (writes OUT/summary.log and OUT/run102.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run102.tar.gz" -C "$w" .; }
{
timeout 200 python3 -m pytest -q -n 14 tests/test_gpu.py -p no:cacheprovider \
    -k "deferred_row_sum or default_dispatch or persistent_tile_loop" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8; pack
ab() {  # tag headdim causal seqlens loads timeout
    timeout "$6" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" \
        --seqlens "$4" --loads "$5" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A12 "^  d c" "$w/$1.log"
    pack
}
ab ds_64w 64 0 2048,4096,8192,16384 gluon-wg3-crw,gluon-wg3-crw-ds 100
ab ds_128p 128 0,1 512,1024,2048,4096,8192 gluon-pers-lean-crw-qr,gluon-pers-lean-crw-qr-ds 140
timeout 100 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --heads 256 \
    > "$w/sanitizer_memcheck_d256.log" 2>&1
echo "memcheck d=256 rc=$?: $(tail -n 1 "$w/sanitizer_memcheck_d256.log")"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
