#!/usr/bin/env bash
# NOTES §132's decision (the walk from the host's table by default: d = 128 causal persistent, d = 64
# from 8 query blocks): (1) the forward's GPU suite as the library now runs (the run169 selection, and
# the table's own tests); (2) compute-sanitizer memcheck and racecheck at the small shapes (the table
# is a new global read); (3) the train sweep at head dims 64, 128, 256 (the README's table), cuDNN in
# the same run; (4) d = 64 causal N = 512 / 1024: the table's model varied (a tile's fixed cost 3 key
# tiles, groups of 4 / 48 MB), to see whether some table also pays at N = 512.
# Usage: bash benchmarks/session_gpu_run174.sh OUT        (writes OUT/summary.log and OUT/run174.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run174.tar.gz" -C "$w" .; }
{
t0=$(date +%s)
timeout 130 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$? $(( $(date +%s) - t0 ))s"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " fwd " | head -n 40
pack
t0=$(date +%s)
timeout 60 python3 benchmarks/ab_fwd.py --out "$w" --tag wtm64 --headdims 64 --causal 1 --seqlens 512,1024 \
    --loads gluon-pers-lean-ds-nowt,gluon-pers-lean-ds-wt,gluon-pers-lean-ds-wt-wtc3,gluon-pers-lean-ds-wt-wtg4,gluon-pers-lean-ds-wt-wtg48 \
    --rounds 3 --rest 0.2 > "$w/wtm64.log" 2>&1
echo "wtm64 rc=$? $(( $(date +%s) - t0 ))s"; grep -A4 "^  d c" "$w/wtm64.log"; grep -i "error\|fail" "$w/wtm64.log" | head -4
pack
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "(hopper_forward and dtype0 and not varlen \
and not extreme and not exp2 and not registers) or persistent_tile_loop or diag_trim or default_dispatch or mask_branch \
or unmasked_keys or walk_table" > "$w/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
for tool in memcheck racecheck; do
    t0=$(date +%s)
    timeout 100 compute-sanitizer --tool $tool python3 benchmarks/sanitize_small.py --heads 64,128 \
        > "$w/sanitizer_${tool}_fwd.log" 2>&1
    echo "$tool rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$w/sanitizer_${tool}_fwd.log")"
    grep -E "^=========\s+(Error|Warning).*" "$w/sanitizer_${tool}_fwd.log" | sed -E 's/\+0x[0-9a-f]+//' | sort | uniq -c | head -6
    pack
done
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
