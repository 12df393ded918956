"""Control for compute-sanitizer's racecheck on the Gluon forward: the smallest warp-specialised
Gluon kernel (a default partition and one worker warp, each storing to its own global buffer, no
shared memory of its own, no barrier of its own). Any shared-memory hazard racecheck reports here
belongs to the compiler's warp-specialisation scaffolding, not to a kernel of this project; the
forward's report can then be read against this one (benchmarks/NOTES.md §21).

    compute-sanitizer --tool racecheck python benchmarks/sanitize_ws_control.py
"""
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _default_part(out_ptr, BLOCK: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    offs = gl.arange(0, BLOCK, layout=layout)
    gl.store(out_ptr + gl.program_id(0) * BLOCK + offs, offs + 1)


@gluon.jit
def _worker_part(aux_ptr, BLOCK: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    offs = gl.arange(0, BLOCK, layout=layout)
    gl.store(aux_ptr + gl.program_id(0) * BLOCK + offs, offs + 2)


@gluon.jit
def ws_control_kernel(out_ptr, aux_ptr, BLOCK: gl.constexpr):
    gl.warp_specialize([(_default_part, (out_ptr, BLOCK)), (_worker_part, (aux_ptr, BLOCK))], [1], [24])


def main():
    block, programs = 128, 4
    out = torch.full((programs * block,), -1, dtype=torch.int32, device="cuda")
    aux = torch.full_like(out, -1)
    ws_control_kernel[(programs,)](out, aux, BLOCK=block, num_warps=4)
    torch.cuda.synchronize()
    ar = torch.arange(block, dtype=torch.int32, device="cuda").repeat(programs)
    assert torch.equal(out, ar + 1) and torch.equal(aux, ar + 2), "control kernel wrote wrong values"
    print("sanitize_ws_control: done")


if __name__ == "__main__":
    main()
