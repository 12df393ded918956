#!/usr/bin/env bash
# NOTES §122's decision (warpgroup 0's diagonal trimmed: the default at d = 256 to 2048 and d = 128 to
# 512) and §121's at d = 256 (the unmasked key loop over the persistent range), checked as the library
# runs them: (1) the GPU tests of both options, the persistent tile loop and the default dispatch;
# (2) the trim at d = 256, N = 4096 / 8192 (ab_fwd, past its default range); (3) the train sweep at
# head dim 256 (the README's rows for it), cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run158.sh OUT        (writes OUT/summary.log and OUT/run158.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run158.tar.gz" -C "$w" .; }
{
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "diag_trim or unmasked_keys or persistent_tile_loop or default_dispatch_takes" > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
t0=$(date +%s)
timeout 120 python3 benchmarks/ab_fwd.py --out "$w" --tag dt256c --headdims 256 --causal 1 --seqlens 4096,8192 \
    --loads "gluon-pers-lean-crw-ds-dt,gluon-pers-lean-crw-ds" --rounds 3 --rest 0.2 > "$w/dt256c.log" 2>&1
echo "dt256c rc=$? $(( $(date +%s) - t0 ))s"; grep -A3 "^  d c" "$w/dt256c.log"
pack
t0=$(date +%s)
timeout 300 python3 -m ioattn bench train --headdims 256 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$? $(( $(date +%s) - t0 ))s"
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " fwd " | head -n 30
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
