"""Ahead-of-time compilation of the Gluon Hopper backward (``ioattn.kernels.hopper_backward``,
experimental, not dispatched) for sm_90, without a GPU: benchmarks/compile_check_hopper_bwd.py in a
child process (this test session may run kernels under the interpreter, which replaces jit
functions; the child runs without TRITON_INTERPRET)."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
def test_hopper_gluon_backward_compiles_for_sm90():
    """Both head dims and masks (bf16 only: fp16 is the same code but the dtype; the script's default
    covers both) compile, fit shared memory, and use wgmma, TMA and the dQ fp32 atomics."""
    pytest.importorskip("triton.experimental.gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compile_check_hopper_bwd.py"), "--quick"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "hopper backward compiled for sm_90: 4 kernels" in proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.startswith("bwd ")]
    assert len(lines) == 4, proc.stdout[-2000:]
    assert all("wgmma=" in line and "atomics[atom" in line for line in lines), proc.stdout[-2000:]
