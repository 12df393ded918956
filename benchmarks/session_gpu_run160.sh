#!/usr/bin/env bash
# NOTES §122's last decisions checked as the library runs them: d = 128 causal calls up to 512 with
# 64-key tiles four deep and the trim (hopper.SHORT_CAUSAL_TILES), the trim at d = 256 over the
# persistent range. (1) GPU tests of the trim, the persistent tile loop and the default dispatch; (2)
# ab_fwd, the new default against the 128-key tiles ("-n128-s2": with the trim as it was the default);
# (3) the train sweep at head dim 128 (the README's rows), cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run160.sh OUT        (writes OUT/summary.log and OUT/run160.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run160.tar.gz" -C "$w" .; }
{
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "diag_trim or persistent_tile_loop or default_dispatch_takes" > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
t0=$(date +%s)
timeout 100 python3 benchmarks/ab_fwd.py --out "$w" --tag short128 --headdims 128 --causal 1 --seqlens 512 \
    --loads "gluon-pers-lean-crw-qr-ds,gluon-pers-lean-crw-n128-s2-qr-ds" --rounds 3 --rest 0.2 > "$w/short128.log" 2>&1
echo "short128 rc=$? $(( $(date +%s) - t0 ))s"; grep -A2 "^  d c" "$w/short128.log"
pack
t0=$(date +%s)
timeout 240 python3 -m ioattn bench train --headdims 128 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$? $(( $(date +%s) - t0 ))s"
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " fwd " | head -n 30
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
