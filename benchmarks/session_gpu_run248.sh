#!/usr/bin/env bash
# (A record: the 80-row form was removed after this run, NOTES §165; it runs against commit 6c721e4.)
# NOTES §165, d = 128's non-causal backward at 80 query rows a step (hopper_backward.WS_EXTRA_ROWS = {128: 16}):
# (1) a smoke call under a time limit (a hang shows here); (2) the GPU tests of the form (against the oracle,
# the ordered mode, the launcher's choice) and the default ws backward at d = 128; (3) ab_bwd, 80 rows
# ("gluon-ws-xr16") against 64 ("gluon-ws"), cuDNN in the same process, two processes in both orders.
# Usage: bash benchmarks/session_gpu_run248.sh OUT   (writes OUT/summary.log, OUT/smoke.*, OUT/memcheck.log if it fails, OUT/tests.log,
# OUT/ab_bwd_a.*, OUT/ab_bwd_b.*)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
cat > "$out/smoke.py" <<'PY'
import torch
from ioattn import hopper
from ioattn.kernels import hopper_backward as hb
hb.WS_EXTRA_ROWS = {128: 16}
q, k, v = (torch.randn(2, 1000, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
out, lse = hopper.hopper_forward(q, k, v, 128 ** -0.5, False)
g = hb.hopper_backward(torch.randn_like(q), q, k, v, out, lse, 128 ** -0.5, False, variant="ws")
torch.cuda.synchronize()
print("smoke ok", [t.float().abs().max().item() for t in g])
PY
timeout 60 python3 "$out/smoke.py" > "$out/smoke.log" 2>&1
rc=$?
echo "smoke rc=$rc $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/smoke.log")"
if [ $rc != 0 ]; then  # where: memcheck names the access
  timeout 120 compute-sanitizer --tool memcheck python3 "$out/smoke.py" > "$out/memcheck.log" 2>&1
  grep -m 12 -E "Invalid|Misaligned|at .*hopper|ERROR SUMMARY|Address" "$out/memcheck.log"
  exit 1
fi
t0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -p no:cacheprovider \
    -k "test_hopper_backward_extra_rows or (test_hopper_backward and ws and 128 and gluon and bfloat16 and not varlen and not window and not softcap and not deterministic)" \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$out/tests.log")"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -12
for order in a b; do
  if [ $order = a ]; then provs=gluon-ws,gluon-ws-xr16,sdpa-cudnn; else provs=gluon-ws-xr16,gluon-ws,sdpa-cudnn; fi
  t0=$(date +%s)
  timeout 150 python3 benchmarks/ab_bwd.py --out "$out" --tag ab_bwd_$order --headdims 128 --causal 0 \
      --seqlens 1024,4096,16384 --rounds 3 --providers $provs > "$out/ab_bwd_$order.log" 2>&1
  echo "ab_bwd $order rc=$? $(( $(date +%s) - t0 ))s"
  tail -n 5 "$out/ab_bwd_$order.log"
done
} 2>&1 | tee "$out/summary.log"
