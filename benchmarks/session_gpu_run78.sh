#!/usr/bin/env bash
# Prepared for the next session (written 2026-12-02, twelfth session): (1) compute-sanitizer memcheck
# on sanitize_small.py, one head dim a call (the whole file did not finish in 170 s under the tool,
# NOTES §69); (2) the persistent forward's GPU tests with every option combination (the default build
# among them: its Q prefetch was factored into a helper after run 77, the same code in SASS but for 8
# instructions) and the default dispatch; (3) NOTES §70, the late epilogue: ab_fwd at d = 128 / 64
# short lengths, both masks, against the default persistent kernel, cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run78.sh OUT        (writes OUT/summary.log and OUT/run78.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
for d in 128; do  # one head dim this call (the call's 600 s); 64 / 256 in run 79
    timeout 150 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_small.py --heads $d \
        > "$w/sanitizer_memcheck_d$d.log" 2>&1
    echo "memcheck d=$d rc=$?: $(tail -n 1 "$w/sanitizer_memcheck_d$d.log")"
done
timeout 150 python3 -m pytest -q -x -n 12 tests/test_gpu.py -p no:cacheprovider \
    -k "persistent_tile_loop or default_dispatch" > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
ab() {  # tag headdim causal seqlens loads timeout
    timeout "$6" python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 2 --rest 0.1 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -A8 "^  d c" "$w/$1.log"
}
ab ab_late_128 128 0,1 512,1024,4096 gluon-pers-lean,gluon-pers-lean-late 140
ab ab_late_64 64 0,1 512,1024 gluon-pers-lean,gluon-pers-lean-late 100
} 2>&1 | tee "$out/summary.log"
tar -czf "$out/run78.tar.gz" -C "$w" . && rm -rf "$w"
