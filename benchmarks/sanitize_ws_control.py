"""Control for compute-sanitizer's racecheck on the Gluon forward: the smallest warp-specialised
Gluon kernel (a default partition and one worker warp, each storing to its own global buffer, no
shared memory of its own). Any shared-memory hazard racecheck reports here belongs to the
compiler's warp-specialisation scaffolding, not to a kernel of this project; the forward's report
can then be read against this one (docs/decisions/compute-sanitizer.md).

The plain control was racecheck-clean on the H200 while the forward was not. ``--local-barrier``
adds the one structural difference found in the forward's SASS: its default partition synchronises
its own warps with a counted barrier (``BAR.SYNC 0x0, <threads>``, barrier 0 over fewer threads
than the CTA), which a tool that reads barrier 0 as the whole-CTA ``__syncthreads`` would misorder
against the worker warps' handshake on barrier 1. If racecheck flags the handshake with it and not
without it, the forward's report is that effect.

The plain control and the one with ``--local-barrier`` were measured (0 and 1 hazards)
while the forward reports 24-30 (48 with the defaults of that time, all on the scaffolding: the
kernel's ``def`` line, ``warp_specialize``, an early ``return``, ``if PINGPONG:``). Two more of the
forward's structural traits, each a flag, so that one racecheck run per combination tells which
one the tool's reports follow: ``--early-return`` (odd programs return before ``warp_specialize``,
as the forward's programs with no query rows do) and ``--fwd-partitions`` (the forward's partition
shape: a 4-warp worker warpgroup and a 1-warp worker beside the default warpgroup, 240 / 32
registers, instead of one 1-warp worker at 24). Each of those was clean on the H200, alone and
together, so one more: ``--mbarrier`` (shared memory of the kernel's own, as every
forward has: an mbarrier and a tile allocated before ``warp_specialize``; the worker warp fills the
tile and arrives, the default partition waits on the barrier's phase and reads the tile back).

    compute-sanitizer --tool racecheck python benchmarks/sanitize_ws_control.py [--local-barrier]
        [--early-return] [--fwd-partitions] [--mbarrier]
"""
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier


@gluon.jit
def _default_part(out_ptr, BLOCK: gl.constexpr, LOCAL_BARRIER: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    offs = gl.arange(0, BLOCK, layout=layout)
    if LOCAL_BARRIER:
        gl.thread_barrier()  # the default partition's own warps only (a counted barrier 0)
    gl.store(out_ptr + gl.program_id(0) * BLOCK + offs, offs + 1)


@gluon.jit
def _worker_part(aux_ptr, BLOCK: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    offs = gl.arange(0, BLOCK, layout=layout)
    gl.store(aux_ptr + gl.program_id(0) * BLOCK + offs, offs + 2)


@gluon.jit
def _worker_wg_part(out_ptr, BLOCK: gl.constexpr, LOCAL_BARRIER: gl.constexpr):
    """A 4-warp worker (the forward's second consumer warpgroup): the default partition's stores,
    offset by one block row of programs."""
    _default_part(out_ptr + gl.num_programs(0) * BLOCK, BLOCK, LOCAL_BARRIER)


@gluon.jit
def _handoff_reader(out_ptr, tile, bar, BLOCK: gl.constexpr):
    """``--mbarrier``'s default partition: waits for the worker's arrive, then stores the tile."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    mbarrier.wait(bar, 0)
    gl.store(out_ptr + gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout), tile.load(layout))


@gluon.jit
def _handoff_writer(aux_ptr, tile, bar, BLOCK: gl.constexpr):
    """``--mbarrier``'s worker warp: its usual stores, the tile filled with offs + 1, one arrive."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    offs = gl.arange(0, BLOCK, layout=layout)
    gl.store(aux_ptr + gl.program_id(0) * BLOCK + offs, offs + 2)
    tile.store(offs + 1)
    mbarrier.arrive(bar, count=1)


@gluon.jit
def ws_control_kernel(out_ptr, aux_ptr, BLOCK: gl.constexpr, LOCAL_BARRIER: gl.constexpr = False,
                      EARLY_RETURN: gl.constexpr = False, FWD_PARTITIONS: gl.constexpr = False,
                      MBARRIER: gl.constexpr = False):
    if EARLY_RETURN:
        if gl.program_id(0) % 2 == 1:  # these programs write nothing (the host checks it)
            return
    if MBARRIER:
        tile = gl.allocate_shared_memory(gl.int32, [BLOCK], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        fence_async_shared()
        gl.warp_specialize([(_handoff_reader, (out_ptr, tile, bar, BLOCK)),
                            (_handoff_writer, (aux_ptr, tile, bar, BLOCK))], [1], [24])
    elif FWD_PARTITIONS:
        gl.warp_specialize([(_default_part, (out_ptr, BLOCK, LOCAL_BARRIER)),
                            (_worker_wg_part, (out_ptr, BLOCK, LOCAL_BARRIER)), (_worker_part, (aux_ptr, BLOCK))],
                           [4, 1], [240, 32])
    else:
        gl.warp_specialize([(_default_part, (out_ptr, BLOCK, LOCAL_BARRIER)), (_worker_part, (aux_ptr, BLOCK))],
                           [1], [24])


def main():
    block, programs = 128, 4
    early, fwd = "--early-return" in sys.argv, "--fwd-partitions" in sys.argv
    mbar = "--mbarrier" in sys.argv  # (takes the place of --fwd-partitions' shape)
    out = torch.full((2 * programs * block,), -1, dtype=torch.int32, device="cuda")  # fwd: two row blocks
    aux = torch.full((programs * block,), -1, dtype=torch.int32, device="cuda")
    ws_control_kernel[(programs,)](out, aux, BLOCK=block, LOCAL_BARRIER="--local-barrier" in sys.argv,
                                   EARLY_RETURN=early, FWD_PARTITIONS=fwd and not mbar, MBARRIER=mbar, num_warps=4)
    torch.cuda.synchronize()
    ar = torch.arange(block, dtype=torch.int32, device="cuda").repeat(programs)
    # the programs that ran (with --early-return the odd ones returned at once): their values, else the poison
    ran = torch.tensor([not (early and p % 2) for p in range(programs)], device="cuda").repeat_interleave(block)
    poison = torch.full_like(ar, -1)
    assert torch.equal(aux, torch.where(ran, ar + 2, poison)), "control kernel: worker warp"
    assert torch.equal(out[:programs * block], torch.where(ran, ar + 1, poison)), "control kernel: default partition"
    assert torch.equal(out[programs * block:], torch.where(ran, ar + 1, poison) if fwd and not mbar else poison), \
        "control kernel: worker warpgroup"
    print("sanitize_ws_control: done", " ".join(a for a in sys.argv[1:]))


if __name__ == "__main__":
    main()
