"""Ahead-of-time compilation of the Triton kernels for sm_90 (Hopper), without a GPU.

The interpreter runs the kernels' logic on CI but not the GPU compiler; a construct the compiler
rejects (a non-constexpr global, an unsupported layout, too much shared memory) would otherwise
first show up on the device. tools/compile_check.py compiles every kernel at the default tiles
and asserts it fits an H200's shared memory and uses wgmma; it runs in a child process because this
test session runs the kernels under the interpreter (which replaces @triton.jit functions). The Gluon
kernels' checks are marked ``gluon``: skipped, with ``ioattn._compat.gluon_status``'s reason, on a Triton
whose Gluon API is not the one they are written against (the portable kernels' check runs everywhere)."""
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import child_env

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _hopper_check(*args):
    """The report lines (one a kernel) of tools/compile_check_hopper.py --quick ``args``, run in a
    child process without the interpreter; the script's own assertions must pass."""
    env = child_env()
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_check_hopper.py"), "--quick", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [line for line in proc.stdout.splitlines() if " tiles=" in line]


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.parametrize("headdims", ["128", pytest.param("59,256", marks=pytest.mark.sass)])
def test_kernels_compile_for_sm90(headdims):
    """The portable kernels at the default features: d = 128 on the CPU; a padded head dim (59) and the
    largest (256, the shared-memory bound) where a GPU is, or with ``--sass``."""
    env = child_env()
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_check.py"), "--quick",
                           "--headdims", headdims], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "all kernels compiled for sm_90" in proc.stdout


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
def test_hopper_gluon_default_builds_compile_for_sm90():
    """The Gluon forward's default builds, causal (the richer mask), in one child process: the ping-pong
    kernel at d = 128 (d = 256 is the same code at other tiles) and three warpgroups at d = 64 (with the
    ping-pong d = 64 build the script's head dims bring): within shared memory, wgmma, TMA and register
    reallocation (the script's assertions), wgmmas not serialised, no spill. Every variant at every head
    dim and mask, and the packed-batch kernel: the next test."""
    lines = _hopper_check("--variants", "pingpong,wg3", "--headdims", "64,128", "--masks", "1")
    assert len(lines) == 3, lines
    for line in lines:
        assert "spill=0B" in line and "wgmma-pipelined" in line and "SERIALIZED" not in line, line
    assert any(line.startswith("pingpong d=128 bf16 causal=True ") for line in lines), lines
    (wg3,) = [line for line in lines if line.startswith("wg3 ")]
    assert "d=64 bf16 causal=True  tiles=192x128x" in wg3 and "inc160x2" in wg3 and "dec168x1" in wg3, wg3


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_gluon_kernel_compiles_for_sm90():
    """The Gluon forward, every variant (base; pingpong; split, its diagnostic twin without the
    ordering; wg3, three consumer warpgroups; persistent, ping-pong with a tile loop), compiles for each of its head dims and
    both masks (bf16 only: fp16 is the same code but the dtype; the script's default covers both; wg3
    at one configuration, causal, to keep CI short; the packed-batch IS_VARLEN kernel at one, pingpong d = 128
causal), fits shared memory and uses wgmma, TMA and
    register reallocation; the ping-pong variants have one consumer partition per warpgroup, K/V
    slots released by every warpgroup, and ptxas neither serialises their wgmmas (C7514) nor spills
    (persistent: at most a few per-tile values around its tile loop, the script's bound)."""
    from ioattn.plan import hopper

    env = child_env()
    main = [v for v in hopper.VARIANTS if v != "wg3"]
    script = str(ROOT / "tools" / "compile_check_hopper.py")
    lines = []
    # and one packed-batch (IS_VARLEN) kernel: the default variant at d = 128, causal
    for args in (["--variants", ",".join(main)], ["--variants", "wg3", "--masks", "1"],
                 ["--variants", "pingpong", "--headdims", "128", "--masks", "1", "--varlen"]):
        proc = subprocess.run([sys.executable, script, "--quick", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        assert "hopper kernel compiled for sm_90" in proc.stdout
        lines += proc.stdout.splitlines()
    (varlen,) = [line for line in lines if " varlen tiles=" in line]
    fixed = [line for line in lines if " varlen tiles=" not in line]
    assert varlen.startswith("pingpong d=128 bf16 causal=True  varlen "), varlen
    assert "spill=0B" in varlen and "wgmma-pipelined" in varlen, varlen
    for variant in main:  # one line per head dim and mask
        expect = 2 * len(hopper.TILE_TABLE[variant])
        assert sum(line.startswith(variant + " ") for line in fixed) == expect, (variant, fixed[-20:])
    assert all("SERIALIZED" not in line for line in lines if not line.startswith("base "))
    # wg3 (the script asserts three consumer partitions and K/V slots of count 3): 160 registers for
    # the two worker consumers, 168 for the default partition, no spill
    (wg3,) = [line for line in lines if line.startswith("wg3 ")]
    assert "d=64 bf16 causal=True  tiles=192x128x" in wg3 and "spill=0B" in wg3 and "wgmma-pipelined" in wg3, wg3
    assert "inc160x2" in wg3 and "dec168x1" in wg3, wg3


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_exp2_fma_compiles_for_sm90():
    """The forward with a quarter of each key tile's exponentials on the FMA units (hopper.exp2_fma(25),
    the kernel's EXP2_FMA), causal, in the ping-pong kernel at d = 64 and 128 and wg3: the column split
    compiles as a register renaming (the kernel asserts its layout conversion trivial), ptxas neither
    serialises the wgmmas nor spills (wg3: at most 128 B), and against the default build every MUFU.EX2
    taken away became the polynomial's three FFMAs (a quarter of the score tiles' exponentials: 16 of 64
    per thread at each of a consumer's softmax call sites: three, and four in the two-warpgroup kernels,
    whose first key tile has a masked and an unmasked form, FEWER_MASKS, unless that tile's mask is under
    its own branch ahead of one form, hopper.mask_branch: causal at d = 128)."""
    import re

    lines = _hopper_check("--variants", "pingpong,wg3", "--headdims", "64,128", "--masks", "1", "--exp2-fma", "0,25")
    assert len(lines) == 6, lines
    counts, branched = {}, set()
    for line in lines:
        key = (line.split()[0], line.split()[1], "exp2_fma=25%" in line)
        counts[key] = tuple(int(re.search(rf"{op}=(\d+)", line).group(1)) for op in ("MUFU.EX2", "FFMA"))
        if "mask_branch" in line:
            branched.add(key[:2])
        if key[2]:
            # wg3 causal (160-register consumers; the option is off by default, docs/decisions/exp2-emulation.md):
            # ptxas spills 92 B since the epilogue's reciprocal (forward-output-stores.md), a few values kept
            # across the partitions' register reallocation; the two-warpgroup kernels none
            spills = int(re.search(r"spill=(\d+)B", line).group(1))
            assert spills <= (128 if key[0] == "wg3" else 0) and "wgmma-pipelined" in line, line
    assert branched == {("pingpong", "d=128")}, branched
    for variant, d in (("pingpong", "d=64"), ("pingpong", "d=128"), ("wg3", "d=64")):
        (mufu0, ffma0), (mufu, ffma) = counts[(variant, d, False)], counts[(variant, d, True)]
        num_wg = 3 if variant == "wg3" else 2
        sites = 3 if variant == "wg3" or (variant, d) in branched else 4
        assert mufu0 - mufu == num_wg * sites * 16, (variant, d, mufu0, mufu)
        assert ffma - ffma0 == 3 * (mufu0 - mufu), (variant, d, ffma0, ffma)


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_row_stores_compile_for_sm90():
    """The forward's output stored as whole rows (hopper.row_stores, the kernel's ROW_STORES), as the
    launcher compiles it, non-causal, ping-pong and persistent at every head dim: with the output
    pointer and row stride aligned as at run time, each consumer warpgroup's 64 x d tile goes out as
    16-byte stores (64 x d x 2 B / 16 B / 128 threads a warpgroup: d / 16 a thread) with no spill,
    shared memory within the H200's; at d = 256 staged in the Q buffers (the persistent kernel loading
    its next tile's Q there after the stores, docs/decisions/forward-output-stores.md), so with the shared memory
    of the build without it (--no-row-stores); the persistent variant at d = 64 (measured slower with it) compiles
    without it. (The persistent kernel as launched copies its output by TMA instead: it is compiled
    here as it was before that, ``--tma-store off``; its own test is the next but one. At d = 64 its
    consumers store the rows of a tile that sees no key with 16-byte stores as well.)"""
    import re

    from ioattn.plan import hopper

    lines = (_hopper_check("--variants", "pingpong", "--masks", "0")
             + _hopper_check("--variants", "persistent", "--masks", "0", "--tma-store", "off"))
    assert len(lines) == 6, lines
    for line in lines:
        variant, d = line.split()[0], int(re.search(r" d=(\d+)", line).group(1))
        wide = re.search(r"STG\.E\.128x(\d+)", line)
        wide = int(wide.group(1)) if wide else 0
        # the persistent consumers' rows that see no key: 16 bytes a thread too at d = 64
        # (docs/decisions/persistent-forward-options.md)
        no_key = 2 * d // 16 if variant == "persistent" and d in hopper.NO_KEY_WIDE_HEADDIMS else 0
        if variant == "persistent" and d == 64:
            assert "row_stores" not in line and wide == no_key, line
        else:
            assert ("row_stores_via_q" in line) == (d == 256), line
            assert "row_stores" in line and "spill=0B" in line and "wgmma-pipelined" in line, line
            assert wide == 2 * d // 16 + no_key, line  # two consumer warpgroups
    plain = _hopper_check("--variants", "pingpong", "--masks", "0", "--headdims", "256", "--no-row-stores")
    assert len(plain) == 1 and "row_stores" not in plain[0] and re.search(r"STG\.E\.128x", plain[0]) is None, plain
    staged = [line for line in lines if line.startswith("pingpong") and " d=256" in line]
    shared = [int(re.search(r"shared=(\d+)", line).group(1)) for line in plain + staged]
    assert shared[0] == shared[1], shared


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_unmasked_keys_compile_for_sm90():
    """No key tile masked on non-causal calls whose key tiles all lie inside the sequence
    (hopper.unmasked_full_keys, the kernel's ``KEY_MASKS`` False; docs/decisions/forward-masked-tiles.md), forced
    off and on: the persistent kernel at d = 64 compiles one softmax body a consumer instead of two (half the
    exponentials in the SASS), wg3 two instead of three (its first key step is always masked
    otherwise), no spill, the wgmma pipelined; causal builds are unchanged."""
    import re

    def ex2(lines):
        return {line.split()[0] + line.split()[3]: int(re.search(r"MUFU.EX2=(\d+)", line).group(1)) for line in lines}

    args = ("--variants", "persistent,wg3", "--headdims", "64")
    plain = _hopper_check(*args, "--unmasked-keys", "off")
    unmasked = _hopper_check(*args, "--unmasked-keys", "on")
    assert len(plain) == len(unmasked) == 4, (plain, unmasked)
    for line in unmasked:
        assert "spill=0B" in line and "wgmma-pipelined" in line, line
        assert ("unmasked_keys" in line) == ("causal=False" in line), line
    before, after = ex2(plain), ex2(unmasked)
    for key in before:
        assert after[key] < before[key] if key.endswith("False") else after[key] == before[key], (key, before, after)
    assert after["persistentcausal=False"] * 2 == before["persistentcausal=False"], (before, after)


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_diag_trim_compile_for_sm90():
    """Warpgroup 0 of the persistent causal kernel computing only the key tiles its own rows see
    (hopper.diag_trim, the kernel's ``DIAG_TRIM``; docs/decisions/causal-diagonal-trim.md), forced off and on,
    every head dim: no spill, the wgmma pipelined; the skip adds no product and no exponential, only the passed
    sections' waits and arrives (``_pp_skip``: two slot waits, a turn wait, three arrives in the PTX); and the
    short causal calls' 64-key tiles at d = 128 (hopper.SHORT_CAUSAL_TILES) compile with it."""
    import re

    from ioattn.plan import hopper

    def counts(lines):
        return {line.split()[1]: tuple(int(re.search(pat, line).group(1)) for pat in
                                       (r"MUFU.EX2=(\d+)", r" wgmma=(\d+)", r"arrive=(\d+)", r"try_wait=(\d+)"))
                for line in lines}

    args = ("--variants", "persistent", "--masks", "1")
    plain = _hopper_check(*args, "--diag-trim", "off")
    trimmed = _hopper_check(*args, "--diag-trim", "on")
    assert len(plain) == len(trimmed) == 3, (plain, trimmed)
    for line in trimmed:
        assert "spill=0B" in line and "wgmma-pipelined" in line and "diag_trim" in line, line
    assert not any("diag_trim" in line for line in plain), plain
    before, after = counts(plain), counts(trimmed)
    for d in ("d=64", "d=128", "d=256"):
        assert after[d][:2] == before[d][:2], (d, before, after)
        assert (after[d][2] - before[d][2], after[d][3] - before[d][3]) == (3, 3), (d, before, after)
    short = hopper.SHORT_CAUSAL_TILES[128][1]
    (line,) = _hopper_check(*args, "--headdims", "128", "--diag-trim", "on", "--block-n", str(short[1]),
                            "--stages", str(short[2]))
    assert "spill=0B" in line and "wgmma-pipelined" in line and "diag_trim" in line, line
    assert f"tiles={short[0]}x{short[1]}x{short[2]}" in line, line


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_fewer_masks_compile_for_sm90():
    """Fewer masked key tiles (the kernel's FEWER_MASKS, hopper.FEWER_MASKS_NUM_WG) in the ping-pong
    kernel as launched, causal, every head dim: the build has it, wgmma pipelined, no spill (the first
    key tile's softmax is compiled twice, masked and not)."""

    lines = _hopper_check("--variants", "pingpong", "--masks", "1")
    assert len(lines) == 3 and all("fewer_masks" in line and "spill=0B" in line and "wgmma-pipelined" in line
                                   for line in lines), lines


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_persistent_options_compile_for_sm90():
    """The persistent kernel with two Q buffers a consumer warpgroup (Q_BUFS, hopper.persistent_q_prefetch)
    and the causal walk by pairs (PAIRED, hopper.paired_walk), both masks, every head dim: the options
    are in the builds where the launcher sets them (two Q buffers at d = 64 / 128 only: the buffers'
    barriers counted by the script; at d = 128 the shared memory of two stages of K and V, 2 x 32 KB
    each, and four Q buffers of 16 KB), wgmma pipelined, no spill (d = 256 causal spilled 40 B with the
    tile index's divisions, before FAST_DIV, docs/decisions/persistent-forward-options.md)."""

    lines = _hopper_check("--variants", "persistent", "--q-prefetch", "--paired")
    assert len(lines) == 6, lines
    for line in lines:
        d, causal = int(line.split(" d=")[1].split()[0]), "causal=True" in line
        assert ("q_prefetch" in line) == (d in (64, 128)) and ("paired" in line) == causal, line
        assert "wgmma-pipelined" in line and " spill=0B " in line, line
        if d == 128:
            assert int(line.split("shared=")[1].split()[0]) >= (2 * 2 * 32 + 4 * 16) * 1024, line


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_tma_store_and_fast_div_compile_for_sm90():
    """The persistent kernel with its output copied by TMA from the Q buffer (ROW_STORES = 3,
    ``--tma-store``) and its tile index by multiply-high (FAST_DIV, ``--fast-div``), both masks, every
    head dim, as launched (against the build with neither, ``--tma-store off --fast-div off``): one bulk
    copy to global memory a consumer warpgroup (two in the PTX), the run-time
    integer divisions down to the walk's length (one a partition, outside the tile loop; 16 or more
    without), wgmma pipelined, no spill."""

    plain = {line.split(" tiles=")[0]: line
             for line in _hopper_check("--variants", "persistent", "--tma-store", "off", "--fast-div", "off")}
    lines = _hopper_check("--variants", "persistent")  # both are the defaults
    assert len(lines) == 6 == len(plain), lines
    for line in lines:
        before = plain[line.split(" tiles=")[0]]
        assert "tma_store " in line and "fast_div " in line and "tma_store " not in before, line
        assert " tma_stores=2 " in line and " tma_stores=0 " in before, line
        assert int(line.split(" int_div=")[1].split()[0]) <= 4 < 16 <= int(before.split(" int_div=")[1].split()[0])
        assert "wgmma-pipelined" in line and " spill=0B " in line, line


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_conditional_rescale_compile_for_sm90():
    """FA4's conditional rescaling (``--cond-rescale``: COND_RESCALE, docs/decisions/conditional-rescale.md) decided
    by the thread: the persistent kernel at every head dim and wg3 compile with the default builds' spill bounds and
    pipelined wgmma, and the accumulator's multiplies sit in branches a thread can skip: one region per
    32 of a thread's d / 2 elements in each consumer partition's key loop, where the build without it
    has none. Decided by the warp (the default): one warp vote a consumer partition's key step and
    uniform branches (no convergence region), and none in the builds the policy leaves out (persistent, d = 64)."""
    branched = lambda line: int(line.split("branched_fmul=")[1].split()[0])  # noqa: E731
    key = lambda line: line.split(" tiles=")[0]  # noqa: E731
    # the key loop with its mask branch (--unmasked-keys off): without it ptxas predicates the thread-
    # decided multiplies instead of branching over them (the persistent d = 64 / 128 defaults,
    # docs/decisions/forward-masked-tiles.md)
    masked = ("--variants", "persistent,wg3", "--masks", "0", "--unmasked-keys", "off")
    base = {key(line): line for line in _hopper_check(*masked, "--cond-rescale", "off")}
    for line in _hopper_check(*masked, "--cond-rescale", "thread"):
        d = int(line.split(" d=")[1].split()[0])
        partitions = 3 if line.startswith("wg3") else 2
        assert "cond_rescale" in line and "spill=0B" in line and "wgmma-pipelined" in line, line
        assert "cond_rescale" not in base[key(line)], base[key(line)]
        assert branched(line) == partitions * (d // 2) // 32 and branched(base[key(line)]) == 0, (line, base[key(line)])
    for line in _hopper_check("--variants", "persistent,wg3", "--headdims", "64,128", "--masks", "0"):
        votes = int(line.split("votes=")[1].split()[0])
        if line.startswith("persistent d=64"):
            assert "cond_rescale" not in line and votes == 0, line
        else:
            assert "cond_rescale_by_warp" in line and branched(line) == 0, line
            assert votes == (3 if line.startswith("wg3") else 2), line  # one a consumer partition


@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_register_options_compile_for_sm90():
    """Q as S = Q K^T's register operand (Q_IN_REGS, docs/decisions/forward-q-in-registers.md): in the default
    two-warpgroup builds at d = 128 only, with the default builds' spill bounds and pipelined wgmma (wg3 and d =
    256 would spill; d = 64 measured slower). The row sum's quad reduction once a tile (DEFERRED_SUM,
    docs/decisions/forward-softmax-form.md): in the default builds of ``hopper.DEFERRED_ROW_SUM_ON`` only; the
    ping-pong kernel at d = 128 with it has fewer shuffles than the same build without it (``--deferred-row-sum
    off``: two a row a key tile gone from every softmax copy); wg3's default non-causal build takes it, without
    spilling (its causal build, which does not, compiles in test_hopper_gluon_kernel_compiles_for_sm90)."""
    from ioattn.plan import hopper
    shfl = lambda line: int(line.split("SHFL=")[1].split()[0])  # noqa: E731
    # one mask: the bit does not depend on it (the default builds of both masks compile in
    # test_hopper_gluon_kernel_compiles_for_sm90, under the same spill and pipelining checks)
    lines = _hopper_check("--variants", "pingpong,persistent", "--masks", "0")
    assert len(lines) == 6, lines
    for line in lines:
        d = int(line.split(" d=")[1].split()[0])
        assert ("q_in_registers" in line) == (d == 128), line
        assert "wgmma-pipelined" in line, line
        if d == 128 and line.startswith("pingpong"):
            assert "spill=0B" in line, line
        assert ("deferred_row_sum" in line) == ((line.split()[0], d) in hopper.DEFERRED_ROW_SUM_ON), line
    (line,) = [line for line in lines if line.startswith("pingpong d=128")]
    (base,) = _hopper_check("--variants", "pingpong", "--headdims", "128", "--masks", "0", "--deferred-row-sum", "off")
    assert "deferred_row_sum" in line and "deferred_row_sum" not in base, (line, base)
    assert "spill=0B" in line and "wgmma-pipelined" in line, line
    assert shfl(line) < shfl(base), (line, base)
    (line,) = _hopper_check("--variants", "wg3", "--masks", "0")  # the default build, with it
    assert "deferred_row_sum" in line and "spill=0B" in line and "wgmma-pipelined" in line, line



@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_ptx_barriers_compile_for_sm90():
    """The forward's partition-barrier pass (hopper.ptx_barriers, ``ioattn.kernels.ptx_barriers``;
    docs/decisions/ptx-barrier-pass.md), off and on, the persistent kernel at every head dim and mask and wg3: with
    it the consumers' 128-thread barriers drop by at least four a key step's worth (one before the waits,
    three before the arrives, in each consumer's loop) and nothing else in the PTX moves (products,
    mbarrier arrives and waits, exponentials), no spill, the wgmma pipelined; the compile check itself
    asserts that each marked build has nothing left for the pass to drop."""
    import re

    def counts(lines):
        out = {}
        for line in lines:
            key = " ".join(line.split()[:4])
            bars = sum(int(n) for n in re.findall(r"bar\.sync \d+/128:(\d+)", line))
            same = tuple(int(re.search(pat, line).group(1)) for pat in
                         (r"MUFU.EX2=(\d+)", r" wgmma=(\d+)", r"arrive=(\d+)", r"try_wait=(\d+)"))
            out[key] = (bars, same)
        return out

    for args in (("--variants", "persistent", "--masks", "0,1"), ("--variants", "wg3", "--masks", "1")):
        off = _hopper_check(*args, "--ptx-barriers", "off")
        on = _hopper_check(*args, "--ptx-barriers", "on")
        assert len(off) == len(on) >= 1, (off, on)
        for line in on:
            assert "spill=0B" in line and "wgmma-pipelined" in line and "ptx_barriers" in line, line
        assert not any("ptx_barriers" in line for line in off), off
        before, after = counts(off), counts(on)
        for key in before:
            assert after[key][1] == before[key][1], (key, before[key], after[key])
            assert after[key][0] <= before[key][0] - 8, (key, before[key], after[key])


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_walk_table_compile_for_sm90():
    """The persistent causal forward with its walk read from the host's table (hopper.walk_table, the
    kernel's ``Walk``; docs/decisions/persistent-causal-walk.md) at d = 64 / 128: no spill, the wgmma pipelined,
    the same products, exponentials and mbarrier operations as the computed walk's build; d = 256 is outside
    ``WALK_TABLE_FITS`` (its build spilled), so compiled without it."""
    import re

    def same(line):
        return tuple(int(re.search(pat, line).group(1)) for pat in
                     (r"MUFU.EX2=(\d+)", r" wgmma=(\d+)", r"arrive=(\d+)", r"try_wait=(\d+)", r"tma=(\d+)"))

    args = ("--variants", "persistent", "--masks", "1")
    off = {" ".join(line.split()[:3]): line for line in _hopper_check(*args, "--walk-table", "off")}
    on = {" ".join(line.split()[:3]): line for line in _hopper_check(*args, "--walk-table", "on")}
    assert off.keys() == on.keys() and len(on) == 3, (off, on)
    for key, line in on.items():
        assert "spill=0B" in line and "wgmma-pipelined" in line, line
        assert ("walk_table" in line) == (" d=256 " not in f" {key} "), line
        assert "walk_table" not in off[key], off[key]
        assert same(line) == same(off[key]), (line, off[key])



@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.parametrize("dp,io_dim", [(256, 192), (128, 96)])
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_split_cols_compile_for_sm90(dp, io_dim):
    """The forward's products over three quarters of the tile's columns at a padded head dim (``PROD_DIM``,
    ``hopper.split_cols``): 192 of d = 256's, 96 of d = 128's (docs/decisions/split-products.md), compile in the
    ping-pong and persistent kernels, both masks: wgmma pipelined, no spill, the S and P V products each
    two commit groups (16 commits against the wide build's 8) with S's wait leaving two P V groups in
    flight, and fewer registers than the wide build."""
    base = ["--variants", "pingpong,persistent", "--headdims", str(dp), "--io-dim", str(io_dim)]
    split, wide = (_hopper_check(*base, "--split-cols", on) for on in ("on", "off"))
    assert len(split) == len(wide) == 4, (split, wide)
    for s, w in zip(split, wide):
        assert s.split(" tiles=")[0] == w.split(" tiles=")[0]
        for line in (s, w):
            assert "spill=0B" in line and "wgmma-pipelined" in line, line
        assert "(commit 16," in s and "w2x" in s, s
        assert "(commit 8," in w and "w2x" not in w, w
        top = [int(line.split("top_reg=")[1].split()[0]) for line in (s, w)]
        assert top[0] < top[1], (s, w)


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_split_ring_compile_for_sm90():
    """The forward's split ring at a padded head dim of 192 (``hopper.split_ring``,
    docs/decisions/split-products.md: K / V as 128- and 64-column tiles) compiles in the ping-pong and persistent
    kernels, both masks: three stages in the 227 KB a block may have (the whole 256-wide tiles fit two), wgmma
    pipelined, no spill, the same products and commit groups as the whole tiles, and fewer TMA loads (no 64-column
    piece past 192)."""
    base = ["--variants", "pingpong,persistent", "--headdims", "256", "--io-dim", "192"]
    ring, whole = (_hopper_check(*base, "--split-ring", on) for on in ("on", "off"))
    assert len(ring) == len(whole) == 4, (ring, whole)
    for r, w in zip(ring, whole):
        assert r.split(" tiles=")[0] == w.split(" tiles=")[0]
        assert "tiles=128x64x3 " in r and "tiles=128x64x2 " in w, (r, w)
        for line in (r, w):
            assert "spill=0B" in line and "wgmma-pipelined" in line, line
            assert int(line.split("shared=")[1].split()[0]) <= 232448, line
        assert r.split("wgmma=")[1].split(")")[0] == w.split("wgmma=")[1].split(")")[0], (r, w)
        tma = [int(line.split(" tma=")[1].split()[0]) for line in (r, w)]
        assert tma[0] < tma[1], (r, w)


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
def test_hopper_fp8_forward_compiles_for_sm90():
    """The FP8 forward (the ping-pong kernel on e4m3 descriptors, V^T's ring, P through shared memory)
    at d = 128, causal or not: 8-bit wgmma, TMA, within shared memory, ptxas not serialising the wgmmas
    (the script's assertions), and no spills (three warpgroups non-causal, two causal:
    ``hopper.fp8_warpgroups``). Every head dim and the packed-sequence build: the next test."""
    lines = _hopper_check("--fp8", "--headdims", "128")
    assert len(lines) == 2 and all(" spills=0 " in line for line in lines), lines
    assert sum("tiles=192x" in line for line in lines) == 1, lines


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_fp8_forward_every_head_dim_compiles_for_sm90():
    """The FP8 forward at each of ``hopper.FP8_TILES``' head dims, causal or not, and over packed
    sequences at d = 128: as the previous test, no spills (three warpgroups where they have none)."""
    from ioattn.plan import hopper

    lines = _hopper_check("--fp8")
    assert len(lines) == 2 * len(hopper.FP8_TILES), lines
    assert all(" spills=0 " in line for line in lines), lines
    assert sum("tiles=192x" in line for line in lines) == 3, lines  # d = 64 both masks, d = 128 non-causal
    (line,) = _hopper_check("--fp8", "--masks", "1", "--varlen", "--headdims", "128")
    assert "varlen" in line and " spills=0 " in line, line


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.sass
def test_hopper_schedule_record_compiles_for_sm90():
    """The one-tile ping-pong forward with its schedule record (``Trace``, ``ioattn bench
    pingpong-trace``: a clock read and a store at each event) compiles for sm_90 without a spill."""
    import re

    lines = _hopper_check("--variants", "pingpong", "--headdims", "128", "--masks", "0", "--trace")
    assert len(lines) == 1, lines
    assert int(re.search(r"spill=(\d+)B", lines[0]).group(1)) == 0, lines[0]


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
@pytest.mark.parametrize("flags,headdim", [
    pytest.param((), 128, id="captures-128"),
    pytest.param(("--no-captures",), 128, marks=pytest.mark.sass, id="plain-128"),
    pytest.param(("--no-captures",), 64, marks=pytest.mark.sass, id="plain-64")])
def test_hopper_forward_with_mask_and_score_functions_compiles_for_sm90(flags, headdim):
    """The ping-pong forward with a score function (a learnable table), a document mask and a block mask's
    lists (``plan_forward_mods``), whole key tiles and a key tail: its 64-key tiles (``plan.mods.TILES``) keep
    the captured tensors' values in registers, no spill inside the key loop, the products pipelined; a mask
    function capturing nothing takes the 128-key tiles (``plan.mods.WIDE_TILES``), the same; at d = 64
    three warpgroups on 64-key tiles (``plan.mods.WG3_TILES``), the block mask's lists regrouped into
    192-row query blocks. No spill at whole key tiles; at a key tail some values saved around the loop
    (one at 128-key tiles, at most 16 bytes; at 64-key tiles up to 160 bytes), none inside it."""
    import re

    lines = _hopper_check("--mods", *flags, "--headdims", str(headdim))
    assert len(lines) == 2, lines
    tiles = ("tiles=192x64 SUB=2" if headdim == 64 else "tiles=128x128 SUB=1" if flags else "tiles=128x64 SUB=2")
    for line in lines:
        assert tiles in line and "loop_spills=0 " in line, line
        assert (headdim == 64) == ("Q_BLOCK=192 " in line), line
        spills = int(re.search(r"spills=(\d+)", line).group(1))
        assert spills <= (0 if "kv_tail=False" in line else 16 if "128x128" in tiles else 160), line


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
def test_portable_kernels_with_mask_and_score_functions_compile_for_sm90():
    """The portable forward, dK / dV and dQ kernels with a generated score function (a learnable table:
    its gradient by atomics), a mask function (document ids) and a block mask's lists, typed as the JIT
    types them (tuples of pointers): they compile for sm_90, and only the dK / dV pass adds into the
    table's gradient."""
    import re

    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_check.py"), "--mods"], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    atomics = {line.split()[0]: int(re.search(r"atomics=(\d+)", line).group(1))
               for line in proc.stdout.splitlines() if "atomics=" in line}
    assert atomics["attn_bwd_dkdv_kernel"] > 0 and atomics["attn_fwd_kernel"] == atomics["attn_bwd_dq_kernel"] == 0
