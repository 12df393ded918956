#!/usr/bin/env bash
# Fifth device call of the eleventh session (2026-12-02): the forward's variant policy after this
# session's kernel changes (NOTES §61 moved the one-tile ping-pong kernel at d = 256, §62 the
# two-warpgroup kernels at short causal lengths), ab_fwd with cuDNN in the same run, 2 interleaved
# rounds with rest: (1) d = 256 non-causal, ping-pong against persistent (PERSISTENT_MAX_SEQLEN 4096);
# (2) d = 64 causal, the portable kernel (the default below 8192) against ping-pong, persistent, wg3;
# (3) d = 64 non-causal, persistent (the default to 1024) against wg3 and ping-pong; (4) d = 128
# non-causal, persistent (the default to 4096) against ping-pong.
# Usage: bash benchmarks/session_gpu_run70.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
ab() {  # tag headdim causal seqlens loads
    timeout 150 python3 benchmarks/ab_fwd.py --out "$out" --tag "$1" --headdims "$2" --causal "$3" --seqlens "$4" \
        --loads "$5" --rounds 2 --rest 0.1 > "$out/$1.log" 2>&1
    echo "$1 rc=$?"; grep -A8 "^  d c" "$out/$1.log"
}
ab ab_pol256 256 0 512,1024,2048,4096,8192 gluon-pp-lean,gluon-pers-lean
ab ab_pol64c 64 1 1024,2048,4096,8192 tma,gluon-pp-lean,gluon-pers-lean,gluon-wg3
ab ab_pol64 64 0 512,1024,2048,4096 gluon-pp-lean,gluon-pers-lean,gluon-wg3
ab ab_pol128 128 0 2048,4096,8192 gluon-pp-lean,gluon-pers-lean
