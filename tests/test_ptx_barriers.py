"""The forward's PTX pass (``ioattn.kernels.ptx_barriers``) on PTX fragments shaped as Triton 3.6 emits
them: which partition barriers it drops and which it must keep. (Its effect on the compiled kernels:
tests/test_sm90_compile.py; on the device: tests/gpu/test_gpu.py::test_hopper_forward_ptx_barriers.)"""
import pytest

pytest.importorskip("triton")

from ioattn.kernels import ptx_barriers as pb  # noqa: E402

WAIT = """\t// begin inline asm
\t{
\t.reg .pred complete;
\twaitLoop:
\tmbarrier.try_wait.parity.shared.b64 complete, [%r10], %r11;
\t@!complete bra.uni waitLoop;
\t}
\t// end inline asm"""
ARRIVE = "\t// begin inline asm\n\t@%p5 mbarrier.arrive.shared::cta.b64 _, [%r20];\n\t// end inline asm"
BAR = "\tbar.sync \t0, 128;"


def run(*lines):
    ptx, counts = pb.drop_partition_barriers("\n".join(lines))
    return ptx.count("bar.sync"), counts


def test_barrier_before_a_wait_is_dropped_even_behind_register_arithmetic():
    assert run(BAR, "\tand.b32 \t%r11, %r9, 1;", WAIT) == (0, {"wait": 1, "arrive": 0, "kept": 0})


@pytest.mark.parametrize("wgmma", ["\twgmma.wait_group.sync.aligned 1;", "\twgmma.commit_group.sync.aligned;"])
def test_barrier_before_an_arrive_after_a_wgmma_is_dropped(wgmma):
    lines = (wgmma, "$L__tmp7:", "\t.loc\t1 746 38", "\tadd.s32 \t%r20, %r19, 131440;", BAR, ARRIVE)
    assert run(*lines) == (0, {"wait": 0, "arrive": 1, "kept": 0})


@pytest.mark.parametrize("between", ["\tst.shared.v4.b32 \t[%r79+147456], {%r1, %r2, %r3, %r4};",
                                     "\tfence.proxy.async.shared::cta;",
                                     "\tld.shared.v2.b32 \t{%r1, %r2}, [%r9+196608];",
                                     "\tstmatrix.sync.aligned.m8n8.x4.shared.b16 [%r1], {%r2, %r3, %r4, %r5};",
                                     WAIT, ARRIVE, "$L__BB0_26:"])
def test_barrier_before_an_arrive_is_kept_when_anything_but_registers_follows_the_wgmma(between):
    """Stores to stage, a fence, a per-warp load, another mbarrier operation or a block boundary between
    the wgmma and the arrive: the barrier may order them, so it stays."""
    assert run("\twgmma.wait_group.sync.aligned 0;", between, BAR, ARRIVE)[1]["arrive"] == 0


def test_barrier_before_an_arrive_with_nothing_issued_is_kept():
    """``_pp_skip``: a turn passed and slots released right after their waits, no wgmma between."""
    assert run(WAIT, BAR, ARRIVE) == (1, {"wait": 0, "arrive": 0, "kept": 1})


@pytest.mark.parametrize("nxt", ["\t@%p5 mbarrier.arrive.expect_tx.shared.b64 _, [%r20], 8192;",
                                 "\t@%p3 cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%rd1, {%r1, %r2, %r3}], [%r4];",
                                 "\twgmma.fence.sync.aligned;", "\t@%p2 bra \t$L__BB0_13;"])
def test_other_barriers_are_kept(nxt):
    assert run("\twgmma.wait_group.sync.aligned 0;", BAR, nxt) == (1, {"wait": 0, "arrive": 0, "kept": 1})


def test_barriers_over_other_thread_counts_are_untouched():
    assert run("\tbar.sync \t0, 256;", WAIT, "\tbarrier.sync \t1;", WAIT)[0] == 1


def test_the_pass_is_idempotent():
    ptx = "\n".join([BAR, WAIT, "\twgmma.commit_group.sync.aligned;", BAR, ARRIVE, WAIT, BAR, ARRIVE])
    once, counts = pb.drop_partition_barriers(ptx)
    assert counts == {"wait": 1, "arrive": 1, "kept": 1}
    assert pb.drop_partition_barriers(once) == (once, {"wait": 0, "arrive": 0, "kept": 1})


def test_the_hook_rewrites_only_marked_ptx():
    """The compile-stage hook wraps the "ptx" stage and changes only PTX carrying the marker."""
    ptx = "\n".join([BAR, WAIT])
    stages = {"ptx": lambda src, metadata: src}
    previous = pb._previous
    try:
        pb._previous = None
        pb._hook(None, stages, None, None, 90)
    finally:
        pb._previous = previous
    assert stages["ptx"](ptx, {}) == ptx
    marked = ptx + f"\n\tmov.b32 %r1, %r2; // {pb.MARKER}"
    assert "bar.sync" not in stages["ptx"](marked, {})
