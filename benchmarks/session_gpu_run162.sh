#!/usr/bin/env bash
# NOTES §124 (a diagnostic, not a change): what the d = 128 backward's dQ hand-off costs. ab_bwd on the
# default ws kernel (d = 128, N = 4096 / 16384, both masks, 3 rounds, cuDNN beside it), then the same
# with (A) the dQ writer's reduce-adds compiled out (under a condition never true at run time: the L2
# reduce traffic gone, the staging stores and hand-off kept), (B) that and the consumers' staging
# store of the dQ block compiled out too (dQ's product kept), on this machine's copy of the tree only,
# then the default again. The patched builds' dQ is wrong by construction (--time-failed: timed, marked
# *). nvidia-smi logs clock, power and clock-event reasons every 100 ms beside it.
# Usage: bash benchmarks/session_gpu_run162.sh OUT        (writes OUT/summary.log and OUT/run162.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run162.tar.gz" -C "$w" .; }
bash benchmarks/smi_log.sh "$w/smi.csv" 100 &
smi=$!
ab() {  # tag
    echo "$1 start $(date +%H:%M:%S.%N)" >> "$w/marks.log"
    timeout 120 python3 benchmarks/ab_bwd.py --out "$w" --tag "$1" --headdims 128 --seqlens 4096,16384 \
        --providers gluon-ws,sdpa-cudnn --rounds 3 --time-failed > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A4 "^  d c" "$w/$1.log"
    echo "$1 end $(date +%H:%M:%S.%N)" >> "$w/marks.log"
    pack
}
{
ab base1
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
print("patched: the writer's reduce-adds compiled out")
PY
ab noreduce
python3 - <<'PY'
p = "ioattn/kernels/hopper_backward.py"
s = open(p).read()
old = '''        mbarrier.wait(dq_empty, (t & 1) ^ 1, pred=t > 0)
        dq_smem.store(dq)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(do_empty.index(s_idx), count=1)  # dO and D done with'''
assert s.count(old) == 1
new = old.replace("        dq_smem.store(dq)\n", "        if seqlen_q < 0:\n            dq_smem.store(dq)\n")
open(p, "w").write(s.replace(old, new))
print("patched: the consumers' dQ staging stores compiled out")
PY
ab nostage
git checkout ioattn/kernels/hopper_backward.py
ab base2
} 2>&1 | tee "$out/summary.log"
kill $smi
pack && rm -rf "$w"
