#!/usr/bin/env bash
# NOTES §132 (the walk from the host's table, on by default: d = 128 persistent causal, d = 64 from 8
# query blocks), run174's parts that ran past their limits: (1) the train sweep at head dims 64, 128,
# 256 (the README's table), cuDNN in the same run; (2) the persistent kernel's GPU tests (the table's
# own, the tile loop's, the default dispatch's); (3) d = 64 / 128 causal: the table's groups of 16 / 4 /
# 2 MB of K / V (run174: 4 MB +2 % at d = 64 N = 1024, one process).
# Usage: bash benchmarks/session_gpu_run175.sh OUT        (writes OUT/summary.log and OUT/run175.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run175.tar.gz" -C "$w" .; }
{
t0=$(date +%s)
timeout 300 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$? $(( $(date +%s) - t0 ))s"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " fwd " | head -n 40
pack
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "walk_table or persistent_tile_loop or default_dispatch" > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
for d in 64 128; do
    base=gluon-pers-lean-ds; [ $d = 128 ] && base=gluon-pers-lean-crw-qr-ds  # each head dim's default build
    t0=$(date +%s)
    timeout 50 python3 benchmarks/ab_fwd.py --out "$w" --tag wtg$d --headdims $d --causal 1 --seqlens 512,1024,2048 \
        --loads $base-wt-wtg2,$base-wt-wtg4,$base-wt --rounds 3 --rest 0.2 > "$w/wtg$d.log" 2>&1
    echo "wtg$d rc=$? $(( $(date +%s) - t0 ))s"; grep -A4 "^  d c" "$w/wtg$d.log"; grep -i "error\|fail" "$w/wtg$d.log" | head -4
    pack
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
