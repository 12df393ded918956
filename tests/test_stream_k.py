"""The persistent forward's stream-K last wave (NOTES §71): the partition of the leftover tiles'
steps into program ranges (``hopper.stream_k_plan`` / ``stream_k_pieces``, the host's twin of the
Gluon kernel's ``_unit``) and the merge kernel (``ioattn.kernels.stream_k``), run here on pieces
computed by torch in float64 from random inputs; the Gluon kernel's own pieces are checked on the
device (tests/test_gpu.py::test_hopper_forward_stream_k)."""
import math

import pytest
import torch

from conftest import DEVICE, assert_within_torch_error
from ioattn import hopper
from ioattn.reference import attention_ref


@pytest.mark.parametrize("programs, num_tiles, nb", [(132, 2048, 128), (132, 2048, 4), (132, 1024, 256),
                                                     (132, 68, 8), (7, 30, 5), (5, 3, 1), (16, 9, 3), (132, 131, 4)])
def test_stream_k_pieces_cover_each_leftover_tile_once(programs, num_tiles, nb):
    """Every key tile of every leftover tile in exactly one piece, at most two pieces a program
    (slots 2p, 2p + 1, the first for the lower tile), no piece a whole wave tile, ranges balanced."""
    plan = hopper.stream_k_plan(programs, num_tiles, nb)
    if plan is None:
        assert num_tiles % programs == 0 or -(-(num_tiles % programs) * nb // programs) >= nb
        return
    num_dp, sk_steps = plan
    first = num_dp * programs
    assert sk_steps == (num_tiles - first) * nb
    seen = {}
    per_program = {}
    for p, slot, t, n_lo, n_cnt in hopper.stream_k_pieces(programs, num_tiles, nb):
        assert first <= t < num_tiles and 0 <= n_lo and n_cnt > 0 and n_lo + n_cnt <= nb
        assert slot // 2 == p
        per_program.setdefault(p, []).append((slot, t, n_cnt))
        for n in range(n_lo, n_lo + n_cnt):
            assert (t, n) not in seen, (t, n)
            seen[t, n] = p
    assert len(seen) == sk_steps
    for p, ps in per_program.items():
        assert len(ps) <= 2 and [s % 2 for s, _, _ in ps] == list(range(len(ps)))
        assert [t for _, t, _ in ps] == sorted(t for _, t, _ in ps)
        assert sum(n for _, _, n in ps) <= -(-sk_steps // programs)  # the balance: one range a program


def test_stream_k_plan_declines_without_a_shorter_last_wave():
    assert hopper.stream_k_plan(132, 2 * 132, 16) is None  # whole waves only
    assert hopper.stream_k_plan(132, 131, 1) is None  # one key tile: a range cannot be shorter
    assert hopper.stream_k_plan(132, 2048, 16) == (15, 68 * 16)


def _pieces_by_torch(q, k, v, pieces, cta_m, block_n, num_m, slots):
    """Each piece's (O / l, lse) in float64 (rows of its tile, keys of its key tiles), as the
    kernel's ``_partial_epilogue`` stores them; every other slot poisoned with NaN."""
    batch, seqlen_q, nheads, d = q.shape
    scale = 1.0 / math.sqrt(d)
    part_o = torch.full((slots, cta_m, d), float("nan"), dtype=torch.float32, device=q.device)
    part_l = torch.full((slots, cta_m), float("nan"), dtype=torch.float32, device=q.device)
    for _, slot, t, n_lo, n_cnt in pieces:
        m_block, bh = t % num_m, t // num_m
        b, h = bh // nheads, bh % nheads
        rows = torch.arange(m_block * cta_m, (m_block + 1) * cta_m)
        qq = q[b, rows.clamp(max=seqlen_q - 1), h].double()  # rows past the end: any finite values
        keys = slice(n_lo * block_n, min((n_lo + n_cnt) * block_n, k.shape[1]))
        s = qq @ k[b, keys, h].double().T * scale
        lse = torch.logsumexp(s, -1)
        part_o[slot] = (torch.softmax(s, -1) @ v[b, keys, h].double()).float()
        part_l[slot] = lse.float()
    return part_o, part_l


@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, nheads, d, programs",
                         # a partial last wave after whole ones; fewer tiles than programs (no whole
                         # wave); fewer steps than programs (empty ranges, whose slots stay poisoned)
                         [(2, 70, 90, 3, 32, 7), (1, 64, 40, 4, 16, 7), (3, 33, 129, 2, 64, 4),
                          (1, 40, 100, 2, 32, 11), (1, 48, 32, 1, 16, 8)])
def test_stream_k_merge_against_float64(batch, seqlen_q, seqlen_k, nheads, d, programs):
    """The merge writes exactly the leftover tiles (the whole-wave tiles' rows keep their poison)
    and their output and lse match the float64 oracle within twice torch's own fp32 error."""
    from ioattn.kernels.stream_k import stream_k_merge_kernel

    cta_m, block_n = 16, 16
    q, k, v = (torch.randn(batch, n, nheads, d, device=DEVICE) for n in (seqlen_q, seqlen_k, seqlen_k))
    num_m, nb = -(-seqlen_q // cta_m), -(-seqlen_k // block_n)
    num_tiles = num_m * batch * nheads
    plan = hopper.stream_k_plan(programs, num_tiles, nb)
    assert plan is not None
    num_dp, sk_steps = plan
    pieces = hopper.stream_k_pieces(programs, num_tiles, nb)
    part_o, part_l = _pieces_by_torch(q, k, v, pieces, cta_m, block_n, num_m, 2 * programs)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((batch, nheads, seqlen_q), float("nan"), device=DEVICE)
    left = num_tiles - num_dp * programs
    stream_k_merge_kernel[(left, cta_m // 8)](part_o, part_l, out, lse, num_dp, sk_steps, programs, nb, num_m, nheads,
                                             seqlen_q, nheads * d, lse.stride(0), lse.stride(1), CTA_M=cta_m,
                                             HEAD_DIM=d, ROWS=8)
    ref, ref_lse = attention_ref(q, k, v)
    same, _ = attention_ref(q, k, v, upcast=False)
    written = torch.zeros(batch, seqlen_q, nheads, dtype=torch.bool)
    for t in range(num_dp * programs, num_tiles):
        m_block, bh = t % num_m, t // num_m
        written[bh // nheads, m_block * cta_m:(m_block + 1) * cta_m, bh % nheads] = True
    assert torch.isnan(out[~written]).all(), "the merge wrote rows of a whole-wave tile"
    assert written.any() and not torch.isnan(out[written]).any()
    mask = written[..., None].expand_as(out)
    assert_within_torch_error("stream-K merge", out[mask], ref[mask], same[mask])
    lse_written = written.permute(0, 2, 1)
    assert torch.allclose(lse[lse_written].double(), ref_lse[lse_written].double(), atol=1e-5, rtol=1e-5)
