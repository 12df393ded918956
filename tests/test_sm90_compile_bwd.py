"""Ahead-of-time compilation of the Gluon Hopper backward (``ioattn.kernels.hopper_backward_ws``) for sm_90, without a GPU: tools/compile_check_hopper_bwd.py in a
child process (this test session may run kernels under the interpreter, which replaces jit
functions; the child runs without TRITON_INTERPRET). About a second per kernel."""
import os
import pathlib
import re
import subprocess
import sys

import pytest
from conftest import child_env

ROOT = pathlib.Path(__file__).resolve().parents[1]


# skipped, with ``ioattn._compat.gluon_status``'s reason, on a Triton whose Gluon API is not the kernels'
pytestmark = pytest.mark.gluon


def _compile_check(*args):
    env = child_env()
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_check_hopper_bwd.py"), "--quick", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout, [line for line in proc.stdout.splitlines() if line.startswith("bwd ")]


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
def test_hopper_gluon_backward_ws_compiles_for_sm90():
    """Variant ws (warp-specialised), one kernel per head dim (causal: it holds every masking path
    the non-causal kernel has, and more): the script itself asserts the structure (setmaxnreg inc 240
    / dec 24, TMA loads, the dQ TMA reduce-add and no atomics, no spill inside the consumers' loop and
    at most 24 B outside it, no C7514, shared memory); checked here again from its report line."""
    out, lines = _compile_check("--variants", "ws", "--causal", "1")
    assert "hopper backward compiled for sm_90: 3 kernels" in out
    assert len(lines) == 3 and {re.search(r" d=(\d+) ", line).group(1) for line in lines} == {"64", "128", "256"}, out
    for line in lines:
        assert int(re.search(r"spill=(\d+)B", line).group(1)) <= 24 and "wgmma-pipelined" in line, line
        assert "loop_spills=0 " in line, line
        assert "inc240" in line and "dec24" in line, line
        assert re.search(r"tma_reduce=[1-9]", line) and "atomics[]" in line, line
        # the flat dQ tile at d = 64 / 128 (``WS_DQ_FLAT``): one bulk reduce-add a block
        name = line.split()[1]
        # the flat tile: one bulk reduce-add a block, two with a partition a warpgroup (its halves)
        reduces = "tma_reduce=2 " if "-wgsplit" in name else "tma_reduce=1 "
        assert ("-flat" in name and reduces in line) == (" d=256 " not in line), line
        assert int(re.search(r"consumer_regs=(\d+)", line).group(1)) <= 240, line
        # the SASS counts (``gluon_aot.sass_counts``, also ab_bwd --sass's): the products and reduce-adds the PTX has
        counts = dict(re.findall(r"([\w.]+)=(\d+)", re.search(r"sass\[([^\]]*)\]", line).group(1)))
        assert counts["HGMMA"] == re.search(r"wgmma=(\d+)", line).group(1), line
        assert counts["UTMAREDG"] == re.search(r"tma_reduce=(\d+)", line).group(1) and counts["REDG"] == "0", line


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.sass
def test_hopper_gluon_backward_ws_d256_column_split_compiles_for_sm90():
    """Variant ws at head dim 256 (the column-split form), both masks, with and without the ordered
    dQ mode: 64-key tiles, two Q stages and one dO stage, no spills, wgmma pipelined, the consumers
    within their 240 registers, and the dQ block reduce-added in two halves (4 bulk messages each
    for a 64 x 128 fp32 tile: 8 in the writer's unrolled piece loop)."""
    out, lines = _compile_check("--variants", "ws", "--headdims", "256", "--deterministic")
    assert "hopper backward compiled for sm_90: 4 kernels" in out
    assert len(lines) == 4, out
    for line in lines:
        assert " d=256 " in line and "tiles=64x64x2/1 " in line, line
        assert "spill=0B" in line and "wgmma-pipelined" in line and "inc240" in line, line
        assert int(re.search(r"consumer_regs=(\d+)", line).group(1)) <= 240, line
        assert "tma_reduce=8 " in line, line


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.sass
def test_hopper_gluon_backward_ws_swizzled_dq_compiles_for_sm90():
    """Variant ws with the swizzled 2-D dQ tile (``WS_DQ_FLAT`` off, the A/B alternative of the flat
    default) at d = 64 / 128, causal, with and without the ordered dQ mode: the bulk reduce-add in
    8-column boxes (8 messages a d = 64 block, 16 a d = 128 one), no spill inside the consumers' loop,
    wgmma pipelined, the consumers within their 240 registers."""
    out, lines = _compile_check("--variants", "ws", "--headdims", "64,128", "--causal", "1", "--deterministic",
                                "--dq-swizzled")
    assert "hopper backward compiled for sm_90: 4 kernels" in out
    assert len(lines) == 4, out
    for line in lines:
        reduces = 8 if " d=64 " in line else 16
        assert "-flat" not in line.split()[1] and f"tma_reduce={reduces} " in line and "wgmma-pipelined" in line, line
        assert "loop_spills=0 " in line and int(re.search(r"spill=(\d+)B", line).group(1)) <= 24, line
        assert int(re.search(r"consumer_regs=(\d+)", line).group(1)) <= 240, line


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.sass
def test_hopper_gluon_backward_ws_lse_in_acc_compiles_for_sm90():
    """Variant ws with lse in S^T's accumulator (``WS_LSE_IN_ACC``) at d = 64 / 128, both masks: no
    spill, wgmma pipelined (the accumulator's initial value is formed before the product is issued,
    as D's in dP^T at d = 64), the consumers within their 240 registers."""
    out, lines = _compile_check("--variants", "ws", "--headdims", "64,128", "--lse-in-acc")
    assert "hopper backward compiled for sm_90: 4 kernels" in out
    assert len(lines) == 4, out
    for line in lines:
        assert "-lse" in line.split()[1] and "wgmma-pipelined" in line, line
        assert int(re.search(r"spill=(\d+)B", line).group(1)) <= 24, line
        assert "loop_spills=0 " in line, line
        assert int(re.search(r"consumer_regs=(\d+)", line).group(1)) <= 240, line


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.sass
def test_hopper_gluon_backward_ws_wg_partitions_compiles_for_sm90():
    """Variant ws with each consumer warpgroup a partition of its own (``WS_WG_PARTITIONS``) at d = 64 /
    128, both masks, with and without the ordered dQ mode: wgmma pipelined in both consumer
    partitions (twice the default build's products in the PTX: each partition has its own copy of the
    loop), no spill inside either loop, each within 240 registers, the dQ tile added as two bulk
    copies."""
    out, lines = _compile_check("--variants", "ws", "--headdims", "64,128", "--deterministic", "--quick",
                                "--wg-partitions")
    assert "hopper backward compiled for sm_90: 8 kernels" in out
    assert len(lines) == 8, out
    for line in lines:
        assert "-wgsplit" in line.split()[1] and "wgmma-pipelined" in line and "loop_spills=0 " in line, line
        assert int(re.search(r"spill=(\d+)B", line).group(1)) <= 24, line
        assert int(re.search(r"consumer_regs=(\d+)", line).group(1)) <= 240, line
        assert "tma_reduce=2 " in line and "wgmma=64 " in line, line


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.sass
def test_hopper_gluon_backward_ws_varlen_compiles_for_sm90():
    """Variant ws's packed-sequence form (``IS_VARLEN``) at every head dim, causal (the richer
    masks), plain and ordered: the fixed-length structure (wgmma pipelined, no spill inside the
    consumers' loop, the consumers within 240 registers, the reduce-adds and no float atomics) with
    the producer's tail path: a second TMA load of each operand (K, V once; Q, dO a step) into the
    tile it zeroes, so twice the fixed-length build's TMA loads in the PTX."""
    out, lines = _compile_check("--variants", "ws", "--causal", "1", "--varlen", "--deterministic")
    assert "hopper backward compiled for sm_90: 6 kernels" in out
    assert len(lines) == 6, out
    _, fixed = _compile_check("--variants", "ws", "--causal", "1", "--deterministic", "--no-ptxas")
    tma_fixed = {(re.search(r" d=(\d+) ", f).group(1), "-det" in f.split()[1]): re.search(r" tma=(\d+) ", f).group(1)
                 for f in fixed}
    for line in lines:
        assert "-varlen" in line.split()[1] and "wgmma-pipelined" in line and "loop_spills=0 " in line, line
        assert int(re.search(r"spill=(\d+)B", line).group(1)) <= 24, line
        assert int(re.search(r"consumer_regs=(\d+)", line).group(1)) <= 240, line
        assert re.search(r"tma_reduce=[1-9]", line) and "f32" not in re.search(r"atomics\[([^\]]*)\]", line).group(1)
        d, det = re.search(r" d=(\d+) ", line).group(1), "-det" in line.split()[1]
        assert int(re.search(r" tma=(\d+) ", line).group(1)) == 2 * int(tma_fixed[(d, det)]), (line, tma_fixed)


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.sass
def test_hopper_backward_split_cols_compile_for_sm90():
    """The ws backward's products over 192 of d = 256's columns at a padded head dim of 192 (``PROD_DIM``,
    ``hopper.bwd_split_cols``, docs/decisions/split-products.md) compile, both masks: wgmma pipelined, no spill,
    S^T, dP^T, dV and dK two commit groups each (10 a step against the wide build's 6), dQ's high half added by two
    64-column TMA reduce messages instead of four (tma_reduce 6 against 8), fewer consumer registers."""
    base = ["--variants", "ws", "--headdims", "256", "--io-dim", "192"]
    split, wide = (_compile_check(*base, "--split-cols", on)[1] for on in ("on", "off"))
    assert len(split) == len(wide) == 2, (split, wide)
    for s, w in zip(split, wide):
        for line in (s, w):
            assert "spill=0B" in line and "wgmma-pipelined" in line, line
        assert "(commit 10," in s and "(commit 6," in w, (s, w)
        assert "tma_reduce=6 " in s and "tma_reduce=8 " in w, (s, w)
        regs = [int(re.search(r"consumer_regs=(\d+)", line).group(1)) for line in (s, w)]
        assert regs[0] < regs[1], (s, w)


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.parametrize("io_dim", [0, 192])
@pytest.mark.sass
def test_hopper_backward_dq_hi_first_compile_for_sm90(io_dim):
    """The column split handing dQ's high half to the writer first (``DQ_HI_FIRST``, docs/decisions/split-products.md)
    compiles at d = 256 and at a padded 192, both masks: wgmma pipelined, no spill, the same products,
    commit groups and reduce messages as the low half first, and one more wait in the writer for its
    bulk reads a step (the high half read, then the Q slot released, before the low half's wait). The
    default build is the high half first at the products over 192 columns only (``WS_DQ_HI_FIRST``)."""
    base = ["--variants", "ws", "--headdims", "256"] + (["--io-dim", str(io_dim)] if io_dim else [])
    hi, lo, default = (_compile_check(*base, *extra)[1] for extra in (["--dq-hi-first", "on"],
                                                                      ["--dq-hi-first", "off"], []))
    assert len(hi) == len(lo) == len(default) == 2, (hi, lo, default)
    assert default == (hi if io_dim == 192 else lo), (io_dim, default)
    for h, l in zip(hi, lo):
        assert "-hifirst" in h and "-hifirst" not in l, (h, l)
        for line in (h, l):
            assert "spill=0B" in line and "wgmma-pipelined" in line, line
        for key in ("wgmma", "tma_reduce", "tma"):
            assert re.search(rf" {key}=(\d+)", h).group(1) == re.search(rf" {key}=(\d+)", l).group(1), (key, h, l)
        assert re.search(r"\(commit \d+,", h).group(0) == re.search(r"\(commit \d+,", l).group(0), (h, l)
        waits = [int(re.search(r"bulk_read_waits=(\d+)", line).group(1)) for line in (h, l)]
        assert waits[0] == waits[1] + 1, (h, l)



@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.parametrize("headdim", [64, pytest.param(128, marks=pytest.mark.sass)])
def test_hopper_gluon_backward_ws_with_a_mask_function_compiles_for_sm90(headdim):
    """The ws kernel at d = 64 (and 128: the device suite, or ``--sass``) with a mask function capturing a tensor (document ids), with its
    block mask's transposed lists (128-query blocks as SUB = 2 steps of 64 rows) and without, and with
    score functions (a bias table captured without a gradient, a softcap written as a function): their
    registers within the budget (``plan.mods.BWD_HEADDIMS``); no spill inside the consumers' loop with
    mask functions, nor with score functions at d = 64 (at d = 128 they spill there, measured faster
    than the portable backward all the same: docs/decisions/programmable-attention.md)."""
    out, lines = _compile_check("--mods", "--headdims", str(headdim))
    assert len(lines) == 5 and all("ws-mods-blocks" in lines[i] and "SUB=2" in lines[i] for i in (0, 2)), out
    assert all("tiles=64x128" in line for line in lines), out
    for line in lines:
        if "d=64" in line or not ("-bias" in line or "-softcap" in line):
            assert "loop_spills=0 " in line and int(re.search(r"spill=(\d+)B", line).group(1)) <= 24, line
        assert int(re.search(r"consumer_regs=(\d+)", line).group(1)) <= 240, line
