#!/usr/bin/env bash
# NOTES §115: (1) the persistent consumer's no-key rows stored wide (16-byte stores, ~180 fewer SASS
# instructions in the tile loop's cold block) against the narrow form, in alternating processes (this
# tree and a copy of it whose persistent call passes WIDE=False, the code before the change), each
# with cuDNN in the same process: d = 128 causal N = 512 / 1024 (run144 measured 300 at 512 against
# run138's 314 before the change), d = 64 both masks N = 512 / 1024; (2) the GPU tests of the
# persistent kernel on this tree (the no-key rows between tiles that do); (3) the train sweep at
# d = 256 (the README's table), cuDNN in the same run.
# Usage: bash benchmarks/session_gpu_run145.sh OUT        (writes OUT/summary.log and OUT/run145.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1
pack() { tar -czf "$out/run145.tar.gz" -C "$w" .; }
{
old=/tmp/ab_narrow; rm -rf $old; mkdir -p $old; cp -r ioattn $old/
python3 - "$old/ioattn/kernels/hopper_forward.py" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
a = "BLOCK_M, HEAD_DIM,\n                                   True)"
assert s.count(a) == 1, "the persistent call's WIDE argument"
open(p, "w").write(s.replace(a, "BLOCK_M, HEAD_DIM,\n                                   False)"))
PY
for r in 1 2; do
    for tree in wide narrow; do
        if [ $tree = wide ]; then pp=.; else pp=$old:.; fi
        PYTHONPATH=$pp timeout 60 python3 benchmarks/ab_fwd.py --out "$w" --tag ab128_${tree}_$r --headdims 128 \
            --causal 1 --seqlens 512,1024 --loads gluon-pers-lean-crw-qr-ds --rounds 2 --rest 0.2 \
            > "$w/ab128_${tree}_$r.log" 2>&1
        echo "ab128 $tree $r rc=$?"; grep -A3 "^  d c" "$w/ab128_${tree}_$r.log"
        PYTHONPATH=$pp timeout 60 python3 benchmarks/ab_fwd.py --out "$w" --tag ab64_${tree}_$r --headdims 64 \
            --causal 0,1 --seqlens 512,1024 --loads gluon-pers-lean-ds --rounds 2 --rest 0.2 \
            > "$w/ab64_${tree}_$r.log" 2>&1
        echo "ab64 $tree $r rc=$?"; grep -A5 "^  d c" "$w/ab64_${tree}_$r.log"
    done
    pack
done
export PYTHONPATH=.
timeout 150 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "persistent_tile_loop or persistent_store_and_index or deferred_row_sum or causal_lpt_order or default_dispatch_takes" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
timeout 200 python3 -m ioattn bench train --headdims 256 --providers ioattn,sdpa-cudnn --out "$w/train" \
    > "$w/train.log" 2>&1
echo "train rc=$?"; rm -f "$w"/train/*.png
sed -n '/== train sweep/,$p' "$w/train.log" | grep -E " fwd " | head -n 30
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
