#!/usr/bin/env bash
# Fourth device call of the eleventh session (2026-12-02): (1) run 68's four failed tests again with
# 4 workers (d = 256, fp16, (2, 4096, 4096, 8, 2): their float64 references ran out of device memory
# next to 15 other workers); (2) compute-sanitizer memcheck and racecheck on sanitize_small.py with
# this session's defaults (d = 256's dQ high half and forward output through the Q buffers, fewer
# masked key tiles), which run 63 / 67 ran before them.
# Usage: bash benchmarks/session_gpu_run69.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 120 python3 -m pytest tests/test_gpu.py -n 4 -v -p no:cacheprovider -rfE \
    -k "test_hopper_backward and ws and 256 and shape6 and dtype1" > "$out/test_gpu_rerun.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu_rerun.log"; grep -E " FAILED | ERROR " "$out/test_gpu_rerun.log" | head -n 5
for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool python3 benchmarks/sanitize_small.py > "$out/sanitizer_$tool.log" 2>&1
    echo "sanitizer $tool rc=$?"; tail -n 2 "$out/sanitizer_$tool.log"
done
grep -h -o "at hopper_[a-z_]*+0x[0-9a-f]* in [a-z_]*.py:[0-9]*" "$out"/sanitizer_racecheck.log | sed 's/+0x[0-9a-f]*//' \
    | sort | uniq -c
