#!/usr/bin/env bash
# NOTES §126 (a diagnostic, not a change): is it the fence after the d = 128 backward's dQ stores that
# costs (§124's (B)), or the stores themselves? ab_bwd on the default ws kernel (d = 128, N = 4096 /
# 16384, both masks, 3 rounds, cuDNN beside it), then (C) the same with the fence after the dQ block's
# stores compiled out (the barrier and arrives kept; the bulk copy may then read stale data, so dQ is
# wrong by construction: --time-failed), on this machine's copy of the tree only, then the default again.
# Usage: bash benchmarks/session_gpu_run165.sh OUT        (writes OUT/summary.log and OUT/run165.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run165.tar.gz" -C "$w" .; }
ab() {  # tag
    timeout 120 python3 benchmarks/ab_bwd.py --out "$w" --tag "$1" --headdims 128 --seqlens 4096,16384 \
        --providers gluon-ws,sdpa-cudnn --rounds 3 --time-failed > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A4 "^  d c" "$w/$1.log"
    pack
}
{
ab base1
python3 - <<'PY'
p = "ioattn/kernels/hopper_backward.py"
s = open(p).read()
old = '''            dq_smem.store(dq)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(do_empty.index(s_idx), count=1)  # dO and D done with'''
assert s.count(old) == 1
open(p, "w").write(s.replace(old, old.replace("            fence_async_shared()\n", "")))
print("patched: the fence after the dQ stores compiled out")
PY
ab nofence
git checkout ioattn/kernels/hopper_backward.py
ab base2
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
