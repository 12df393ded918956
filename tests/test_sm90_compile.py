"""Ahead-of-time compilation of the Triton kernels for sm_90 (Hopper), without a GPU.

The interpreter runs the kernels' logic on CI but not the GPU compiler; a construct the compiler
rejects (a non-constexpr global, an unsupported layout, too much shared memory) would otherwise
first show up on the device. benchmarks/compile_check.py compiles every kernel at the default tiles
and asserts it fits an H200's shared memory and uses wgmma; it runs in a child process because this
test session runs the kernels under the interpreter (which replaces @triton.jit functions)."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compile_check.py"), "--quick",
                           "--headdims", "59,128,256"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "all kernels compiled for sm_90" in proc.stdout


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
def test_hopper_gluon_kernel_compiles_for_sm90():
    """The Gluon forward (experimental, opt-in), every variant (base; pingpong; split, its diagnostic
    twin without the ordering), compiles for each of its head dims and both masks (bf16 only: fp16 is the same
    code but the dtype; the script's default covers both), fits shared memory and uses wgmma, TMA and
    register reallocation; the two ping-pong variants have two consumer partitions, K/V slots
    released by both warpgroups, and ptxas neither serialises their wgmmas (C7514) nor spills."""
    pytest.importorskip("triton.experimental.gluon")
    from ioattn import hopper

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compile_check_hopper.py"), "--quick",
                           "--variants", ",".join(hopper.VARIANTS)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "hopper kernel compiled for sm_90" in proc.stdout
    lines = proc.stdout.splitlines()
    for variant in hopper.VARIANTS:  # one line per head dim and mask
        expect = 2 * len(hopper.TILE_TABLE[variant])
        assert sum(line.startswith(variant + " ") for line in lines) == expect, (variant, proc.stdout[-2000:])
    assert all("SERIALIZED" not in line for line in lines if not line.startswith("base "))
