#!/usr/bin/env bash
# NOTES §116 (prepared in the twenty-third session, to run first in the next): every key step of a
# causal call masked, one softmax body in the key loop (hopper.mask_every_step, LEAN bit 6, off by
# default). (1) its GPU tests (two-warpgroup variants, every head dim, ragged / no-key rows / several
# tiles a program / seqlen_k > seqlen_q); (2) ab_fwd, causal, each head dim's default persistent
# options with and without it, N = 512 ... 4096, 3 interleaved rounds, cuDNN in the same run; (3) the
# one-tile ping-pong kernel at d = 128, N = 8192 / 16384 causal (its cost where the key loop is long).
# Usage: bash benchmarks/session_gpu_run147.sh OUT        (writes OUT/summary.log and OUT/run147.tar.gz)
set -u
out=${1:?outdir}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
pack() { tar -czf "$out/run147.tar.gz" -C "$w" .; }
{
timeout 150 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider -k "mask_every_step" \
    > "$w/tests.log" 2>&1
echo "tests rc=$?: $(tail -n 1 "$w/tests.log")"
grep -E "^(FAILED|ERROR)" "$w/tests.log" | head -8
pack
# each head dim's default persistent options spelled out ("-ds" / "-qr" / "-crw": off without them)
for spec in "64:gluon-pers-lean-ds" "128:gluon-pers-lean-crw-qr-ds" "256:gluon-pers-lean-crw-ds"; do
    d=${spec%%:*}; load=${spec#*:}
    timeout 90 python3 benchmarks/ab_fwd.py --out "$w" --tag me$d --headdims $d --causal 1 \
        --seqlens 512,1024,2048,4096 --loads $load,$load-me --rounds 3 --rest 0.2 > "$w/me$d.log" 2>&1
    echo "me$d rc=$?"; grep -E "Error|error" "$w/me$d.log" | head -4; grep -A5 "^  d c" "$w/me$d.log"
    pack
done
timeout 90 python3 benchmarks/ab_fwd.py --out "$w" --tag me128pp --headdims 128 --causal 1 --seqlens 8192,16384 \
    --loads gluon-pp-lean-crw-qr-ds,gluon-pp-lean-crw-qr-ds-me --rounds 2 --rest 0.2 > "$w/me128pp.log" 2>&1
echo "me128pp rc=$?"; grep -A3 "^  d c" "$w/me128pp.log"
} 2>&1 | tee "$out/summary.log"
pack && rm -rf "$w"
