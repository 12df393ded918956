#!/usr/bin/env bash
# NOTES §109 (a diagnostic, not a change): what the persistent forward's output stores cost at short
# lengths. ab_fwd on each head dim's default persistent options (d = 128: gluon-pers-lean-crw-qr-ds,
# d = 64: gluon-pers-lean), N = 512 / 1024 / 4096, both masks, 2 rounds; then the same with the
# kernel's output stores compiled out (``_store_tile``'s body under a condition never true at run
# time, so the normalisation and conversion feeding it are dead code too; the lse stores stay), on
# this machine's copy of the tree only. The patched build's outputs are wrong by construction (its
# check fails): only its time is read. cuDNN in both runs calibrates them.
# Usage: bash benchmarks/session_gpu_run134.sh OUT        (writes OUT/summary.log and OUT/run134.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run134.tar.gz" -C "$w" .; }
ab() {  # tag headdim loads
    timeout 100 python3 benchmarks/ab_fwd.py --out "$w" --tag "$1" --headdims "$2" --causal 0,1 \
        --seqlens 512,1024,4096 --loads "$3" --rounds 2 --rest 0.2 > "$w/$1.log" 2>&1
    echo "$1 rc=$?"; grep -E "Error|error" "$w/$1.log" | head -4; grep -A8 "^  d c" "$w/$1.log"
    pack
}
{
ab base128 128 gluon-pers-lean-crw-qr-ds
ab base64 64 gluon-pers-lean
python3 - <<'PY'
p = "ioattn/kernels/hopper_forward.py"
s = open(p).read()
old = '''    o_rows = m_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    ptrs = Out + (q_row0 - m_start + o_rows).to(gl.int64)[:, None] * stride_om + q_col + o_cols[None, :]
    gl.store(ptrs, o16, mask=(o_rows < seqlen_q)[:, None])'''
assert old in s
new = "    if stride_om < 0:\n" + "\n".join("    " + line for line in old.splitlines())
open(p, "w").write(s.replace(old, new))
print("patched: output stores compiled out")
PY
ab nostore128 128 gluon-pers-lean-crw-qr-ds
ab nostore64 64 gluon-pers-lean
git checkout ioattn/kernels/hopper_forward.py
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
