#!/usr/bin/env bash
# Second device call of the twelfth session (2026-12-02): NOTES §66, the persistent forward's two Q
# buffers a warpgroup (-q2) and causal walk by pairs (-pair). (1) GPU tests of the persistent kernel
# with every option combination (the defaults among them); (2) ab_fwd
# at the short lengths where the persistent kernel runs or could, cuDNN in the same run, 2 interleaved
# rounds with rest; (3) racecheck on the warp-specialisation control with shared memory of its own
# (--mbarrier, NOTES §65).
# Usage: bash benchmarks/session_gpu_run73.sh OUT        (writes OUT/summary.log and OUT/run73.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
timeout 200 python3 -m pytest -q -x -n 8 tests/test_gpu.py -k "persistent_tile_loop" -p no:cacheprovider > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
ab() {  # tag headdim causal seqlens loads
    timeout 170 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 2 --rest 0.1 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -A8 "^  d c" "$w/$1.log"
}
ab ab_q2_128c 128 1 512,1024,2048,4096 gluon-pp-lean,gluon-pers-lean,gluon-pers-lean-q2,gluon-pers-lean-pair,gluon-pers-lean-q2-pair
ab ab_q2_128 128 0 512,1024,2048,4096 gluon-pp-lean,gluon-pers-lean,gluon-pers-lean-q2
ab ab_q2_64c 64 1 512,1024,2048,4096 tma,gluon-pers-lean,gluon-pers-lean-q2,gluon-pers-lean-q2-pair
ab ab_q2_64 64 0 512,1024,2048 gluon-pers-lean,gluon-pers-lean-q2
for flags in "--mbarrier" "--mbarrier --early-return"; do
    timeout 60 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_ws_control.py $flags \
        >> "$w/racecheck_control.log" 2>&1
    echo "control [$flags] rc=$?: $(grep -h 'RACECHECK SUMMARY' "$w/racecheck_control.log" | tail -n 1)"
done
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run73.tar.gz" -C "$w" . && rm -rf "$w"
