#!/usr/bin/env bash
# Prepared for the next session (NOTES §128): where §124's (B) gains its +20 % at d = 128 non-causal.
# Nsight Compute source counters (as run131) of the default ws backward, N = 4096, non-causal, then of
# builds (A) (the writer's reduce-adds compiled out) and (B) (also the consumers' dQ staging stores),
# patched on this machine's copy only (run162's patches); per build the SASS-level CSV and the
# WarpStateStats / SpeedOfLight summary. The question: which instructions' samples fall between (A)
# and (B) (the stores' own, the fence's, or the producer's and the products' waits elsewhere).
# Usage: bash benchmarks/session_gpu_run167.sh OUT        (writes OUT/summary.log and OUT/run167.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run167.tar.gz" -C "$w" .; }
prof() {  # tag
    timeout 150 ncu --clock-control none --nvtx --nvtx-include "ioattn-d128/" --kernel-name regex:hopper_bwd_ws \
        --section WarpStateStats --section SourceCounters --section SpeedOfLight -f -o "$w/src_$1" \
        python3 benchmarks/ncu_bwd.py --headdims 128 --seqlen 4096 > "$w/ncu_$1.log" 2>&1
    echo "ncu $1 rc=$?"; tail -n 1 "$w/ncu_$1.log"
    ncu -i "$w/src_$1.ncu-rep" --page details > "$w/details_$1.txt" 2>&1
    grep -E "Duration|Elapsed Cycles|SM Frequency|Warp Cycles Per Issued|Issued Warp" "$w/details_$1.txt" | head -8
    ncu -i "$w/src_$1.ncu-rep" --page source --csv --print-source sass > "$w/sass_$1.csv" 2>&1
    gzip -f "$w/sass_$1.csv"; rm -f "$w/src_$1.ncu-rep"
    pack
}
{
prof default
python3 - <<'PY'
p = "ioattn/kernels/hopper_backward.py"
s = open(p).read()
old = '''            if WG_SPLIT:  # the two halves of the block's region
                _tma_reduce_add(dq_desc, [((b * nheads + h) * n_m_total + m) * FLAT_ROWS, 0],
                                dq_smem._reinterpret(gl.float32, [FLAT_ROWS // 2, 32], dq_desc.layout))
                _tma_reduce_add(dq_desc, [((b * nheads + h) * n_m_total + m) * FLAT_ROWS + FLAT_ROWS // 2, 0],
                                dq_smem1._reinterpret(gl.float32, [FLAT_ROWS // 2, 32], dq_desc.layout))'''
assert s.count(old) == 1
lines = old.splitlines()
new = "\n".join([lines[0], "                if seqlen_q < 0:"] + ["    " + l for l in lines[1:]])
open(p, "w").write(s.replace(old, new))
print("patched (A): the writer's reduce-adds compiled out")
PY
prof noreduce
python3 - <<'PY'
p = "ioattn/kernels/hopper_backward.py"
s = open(p).read()
old = '''        mbarrier.wait(dq_empty, (t & 1) ^ 1, pred=t > 0)
        dq_smem.store(dq)
        fence_async_shared()'''
assert s.count(old) == 1
open(p, "w").write(s.replace(old, old.replace("        dq_smem.store(dq)\n", "        if seqlen_q < 0:\n            dq_smem.store(dq)\n")))
print("patched (B): the consumers' dQ staging stores compiled out too")
PY
prof nostage
git checkout ioattn/kernels/hopper_backward.py
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
