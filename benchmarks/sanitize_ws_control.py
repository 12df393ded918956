"""Control for compute-sanitizer's racecheck on the Gluon forward: the smallest warp-specialised
Gluon kernel (a default partition and one worker warp, each storing to its own global buffer, no
shared memory of its own). Any shared-memory hazard racecheck reports here belongs to the
compiler's warp-specialisation scaffolding, not to a kernel of this project; the forward's report
can then be read against this one (benchmarks/NOTES.md §21).

The plain control was racecheck-clean on the H200 while the forward was not. ``--local-barrier``
adds the one structural difference found in the forward's SASS: its default partition synchronises
its own warps with a counted barrier (``BAR.SYNC 0x0, <threads>``, barrier 0 over fewer threads
than the CTA), which a tool that reads barrier 0 as the whole-CTA ``__syncthreads`` would misorder
against the worker warps' handshake on barrier 1. If racecheck flags the handshake with it and not
without it, the forward's report is that effect.

    compute-sanitizer --tool racecheck python benchmarks/sanitize_ws_control.py [--local-barrier]
"""
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


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
def ws_control_kernel(out_ptr, aux_ptr, BLOCK: gl.constexpr, LOCAL_BARRIER: gl.constexpr = False):
    gl.warp_specialize([(_default_part, (out_ptr, BLOCK, LOCAL_BARRIER)), (_worker_part, (aux_ptr, BLOCK))],
                       [1], [24])


def main():
    block, programs = 128, 4
    out = torch.full((programs * block,), -1, dtype=torch.int32, device="cuda")
    aux = torch.full_like(out, -1)
    ws_control_kernel[(programs,)](out, aux, BLOCK=block, LOCAL_BARRIER="--local-barrier" in sys.argv,
                                   num_warps=4)
    torch.cuda.synchronize()
    ar = torch.arange(block, dtype=torch.int32, device="cuda").repeat(programs)
    assert torch.equal(out, ar + 1) and torch.equal(aux, ar + 2), "control kernel wrote wrong values"
    print("sanitize_ws_control: done")


if __name__ == "__main__":
    main()
