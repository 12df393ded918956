"""A PTX pass for the Gluon forward's consumer warpgroups: drop the partition barriers (``bar.sync id,
128``) that Triton 3.6 puts in front of every mbarrier wait and single-thread arrive, where the
wgmma's own warpgroup-wide issue already orders the warps (docs/decisions/ptx-barrier-pass.md).

Triton emits each mbarrier arrive from one leader thread after a barrier over the partition's warps,
and a barrier before each wait, so that no warp can still be polling a phase that a leader's arrive
lets the producer complete twice (the double-phase hazard: a parity wait on a barrier two phases on
passes or blocks wrongly). In the forward's key loop every release (K after its S product, V after
its P V) and every turn hand-off follows a wgmma issued or retired by the whole warpgroup: a
``wgmma.mma_async`` runs only once all four warps have issued it, and each warp issued it after its
own waits, so when the leader's ``wgmma.wait_group`` returns, or it has committed the group, every
warp has left the waits that the arrive could advance. Those barriers order nothing more.

The rule, per barrier over 128 threads (one consumer warpgroup):
- followed by a plain ``mbarrier.arrive`` (not ``arrive.expect_tx``): dropped when the nearest
  synchronising instruction above it in the same basic block is ``wgmma.wait_group`` or
  ``wgmma.commit_group`` with only register instructions between (no load, store, fence, bulk copy,
  barrier or mbarrier operation); kept otherwise (a release after shared-memory stores, a turn passed
  with nothing issued);
- followed by ``mbarrier.try_wait``: dropped (a wait orders nothing by itself; the arrives that
  could lap it are those above, each after a warpgroup-wide wgmma or behind a kept barrier);
- any other (before a bulk copy, an expect_tx, a layout conversion's shared-memory round trip): kept.

The rule is sound for a kernel whose consumers read the slots that such an arrive releases only
through wgmma (a collective read) and make every other shared-memory access behind a barrier the
rule keeps: the forward's consumers (K / V by wgmma; Q's register copy, ``Q_IN_REGS``, reloaded
behind the barrier before the next Q load's expect_tx; the output's staging behind the barriers
before its bulk copy). The Gluon backward carries no marker: at d = 128 (a partition a warpgroup) the
rule, with one for two releases in a row, was sound there too (each warp's lse loads feed S^T's
accumulator before S^T is issued) but measured level, so it was not kept.

Applied only to PTX that carries ``MARKER`` (emitted by a kernel compiled with the option), through
Triton's compile-stage hook, so other kernels and other builds of the same kernel are untouched.
Triton's cache key does not see the hook, but it sees the kernel's ``PTX_BARRIERS`` and the marker (a
constexpr global of the kernel, naming this file's contents by hash): a build with and one without the
pass never share a cache entry, and neither do builds by two versions of the pass.
"""
import hashlib
import re

from triton import knobs


def _source_digest() -> str:
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


# the marker names this file's contents: the kernel holds it as a constexpr global, which Triton's cache
# key includes, so an edit to the pass compiles anew instead of loading PTX the old rule rewrote
MARKER = f"ioattn-ptx-pass:drop-partition-barriers:{_source_digest()}"

_BAR = re.compile(r"^\s*bar\.sync\s+\d+,\s*128;\s*$")
_ARRIVE = re.compile(r"^\s*(@%p\d+\s+)?mbarrier\.arrive\.shared::cta\.b64\s+_,")
_WAIT = re.compile(r"^\s*mbarrier\.try_wait")
_WGMMA_SYNC = re.compile(r"^\s*wgmma\.(wait_group|commit_group)\b")
# instructions that touch memory or synchronise: none may sit between the wgmma and a dropped barrier
_MEMORY = re.compile(r"^\s*(@!?%p\d+\s+)?(ld|st|cp|fence|bar|barrier|mbarrier|atom|red|stmatrix|ldmatrix|"
                     r"tensormap|wgmma\.fence|setmaxnreg)\b")
_SKIP = re.compile(r"^\s*($|//|\{|\}|\.reg\b|\.loc\b|\$L__tmp\d+:|waitLoop:|skipWait:)")
_BLOCK = re.compile(r"^\s*\$L__BB\d+_\d+:")


_CONTROL = re.compile(r"^\s*(@!?%p\d+\s+)?(bra|ret|exit|call)\b|^\s*\$L__BB\d+_\d+:")


def _next_instruction(lines, i):
    """The first instruction after line i that touches memory, synchronises or branches (register
    arithmetic, such as a barrier's address, is passed over), or a block's label; "" at the end."""
    for j in range(i + 1, len(lines)):
        line = lines[j]
        if _SKIP.match(line):
            continue
        if _MEMORY.match(line) or _CONTROL.match(line) or "mbarrier" in line or "wgmma" in line:
            return line
    return ""


def _after_wgmma(lines, i):
    """The barrier at line i has, above it in its basic block, a wgmma wait or commit with only
    register instructions between."""
    for j in range(i - 1, -1, -1):
        line = lines[j]
        if _WGMMA_SYNC.match(line):
            return True
        if _BLOCK.match(line) or _MEMORY.match(line) or "wgmma.mma_async" in line or "mbarrier" in line:
            return False
    return False


def drop_partition_barriers(ptx: str) -> tuple[str, dict]:
    """The pass (the module's rule); returns the new PTX and how many barriers it dropped / kept by
    kind ({"wait": n, "arrive": n, "kept": n})."""
    lines = ptx.split("\n")
    out, counts = [], {"wait": 0, "arrive": 0, "kept": 0}
    for i, line in enumerate(lines):
        if _BAR.match(line):
            nxt = _next_instruction(lines, i)
            if _WAIT.match(nxt):
                counts["wait"] += 1
                continue
            if _ARRIVE.match(nxt) and _after_wgmma(lines, i):
                counts["arrive"] += 1
                continue
            counts["kept"] += 1
        out.append(line)
    return "\n".join(out), counts


def _hook(backend, stages, *rest):
    """Triton's compile-stage hook (``knobs.runtime.add_stages_inspection_hook``): the "ptx" stage
    wrapped so that marked PTX goes through ``drop_partition_barriers``."""
    if _previous is not None:
        _previous(backend, stages, *rest)
    make_ptx = stages["ptx"]

    def ptx_stage(src, metadata):
        ptx = make_ptx(src, metadata)
        return drop_partition_barriers(ptx)[0] if MARKER in ptx else ptx

    stages["ptx"] = ptx_stage


_previous = None


def install():
    """Put the pass in Triton's compile stages (once; a hook set before is kept and called first)."""
    global _previous
    if knobs.runtime.add_stages_inspection_hook is _hook:
        return
    _previous = knobs.runtime.add_stages_inspection_hook
    knobs.runtime.add_stages_inspection_hook = _hook
