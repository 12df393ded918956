#!/usr/bin/env bash
# NOTES §115: the deferred row sum on by default in the d = 64 persistent kernel, and the rows that see
# no key stored with 16-byte stores (a smaller cold block inside the persistent consumer's tile loop).
# (1) GPU tests: the persistent kernel's tile loop (rows that see no key between tiles that do), its
# stores and index, the deferred row sum, the causal walk, varlen (the one-tile kernel's no-key path:
# a sequence with no keys), the default dispatch; (2) ab_fwd on the new defaults at the short lengths
# (d = 64 / 128 / 256, both masks, against run143's / run139's figures for the same loads; cuDNN in the
# same run); (3) the train sweep at d = 128 / 64 (the README's table), cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run144.sh OUT        (writes OUT/summary.log and OUT/run144.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run144.tar.gz" -C "$w" .; }
{
timeout 150 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "persistent_tile_loop or persistent_store_and_index or deferred_row_sum or causal_lpt_order or default_dispatch_takes or test_hopper_forward_varlen" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
# each head dim's default persistent options spelled out ("-ds" / "-qr" / "-crw": off without them)
for spec in "64:gluon-pers-lean-ds" "128:gluon-pers-lean-crw-qr-ds" "256:gluon-pers-lean-crw-ds"; do
    d=${spec%%:*}; load=${spec#*:}
    timeout 70 python3 benchmarks/ab_fwd.py --out "$w" --tag fwdshort$d --headdims $d --causal 0,1 \
        --seqlens 512,1024,2048,4096 --loads $load --rounds 2 --rest 0.2 > "$w/fwdshort$d.log" 2>&1
    echo "fwdshort$d rc=$?"; grep -E "Error|error" "$w/fwdshort$d.log" | head -4; grep -A9 "^  d c" "$w/fwdshort$d.log"
done
pack
timeout 260 python3 -m ioattn bench train --headdims 128,64 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$?"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " fwd " | head -n 30
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
