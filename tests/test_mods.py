"""Programmable attention: ``mask_mod``, ``score_mod`` and ``block_mask`` of ``flash_attn_func`` /
``flash_attn_varlen_func`` (``ioattn.mods``, ``ioattn.block_mask``).

Each function of the library, compositions, block masks and block-sparse layouts against
``reference.naive.attention_ref(..., score_mod=, mask_mod=)`` in float64, forward and backward (the
gradient of a captured bias table included), within twice PyTorch's own error in the same dtype, on
the portable Triton kernels (the interpreter here) and on the CPU path.
"""
import dataclasses

import pytest
import torch

import ioattn
import ioattn.mods as M
from conftest import DEVICE, assert_within_torch_error, fake_launches
from ioattn.block_mask import _classify_dense, block_sparse_mask, create_block_mask
from ioattn.plan import dispatch, hopper
from ioattn.plan import mods as mods_plan
from ioattn.reference.naive import attention_ref

F64, F16 = torch.float64, torch.float16
B, SQ, SK, H, HK, D = 2, 40, 48, 4, 2, 16


def _inputs(seed, sq=SQ, sk=SK, lead=(B,)):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, sq, H, D, generator=g, dtype=F64)
    k, v = (torch.randn(*lead, sk, HK, D, generator=g, dtype=F64) for _ in range(2))
    dout = torch.randn(*lead, sq, H, D, generator=g, dtype=F64)
    return q, k, v, dout


def _table(dtype=torch.float32):
    g = torch.Generator().manual_seed(7)
    return (torch.randn(H, 2 * 12 + 1, generator=g, dtype=F64) * 0.5).to(dtype)


_DOCS = torch.tensor([0] * 15 + [1] * 20 + [2] * 13, dtype=torch.int32)  # SK tokens; q reads the first SQ

# name -> (kwargs of the call, built from (table or None, the device its captured tensors live on)): each a
# function of the library or a composition
CASES = {
    "causal": lambda t, dev: dict(mask_mod=M.causal_mask),
    "bottom_right_causal": lambda t, dev: dict(mask_mod=M.bottom_right_causal(SQ, SK)),
    "sliding_window": lambda t, dev: dict(mask_mod=M.sliding_window(9, 2, offset=SK - SQ)),
    "prefix_lm": lambda t, dev: dict(mask_mod=M.prefix_lm(11)),
    "document_causal": lambda t, dev: dict(mask_mod=M.document_mask(_DOCS.to(dev), M.causal_mask)),
    "or_masks": lambda t, dev: dict(mask_mod=M.or_masks(M.sliding_window(3), M.prefix_lm(5))),
    "alibi": lambda t, dev: dict(score_mod=M.alibi(torch.linspace(0.1, 1.0, H, device=dev), SK - SQ)),
    "softcap": lambda t, dev: dict(score_mod=M.softcap(2.5)),
    "relative_bias": lambda t, dev: dict(score_mod=M.relative_bias(t)),
    "bias_and_causal": lambda t, dev: dict(score_mod=M.relative_bias(t),
                                           mask_mod=M.and_masks(M.causal_mask, M.sliding_window(20))),
}
_WITH_TABLE = {"relative_bias", "bias_and_causal"}


def _run(fn, q, k, v, dout, dtype, device, table, **kw):
    leaves = [t.to(device, dtype).requires_grad_(True) for t in (q, k, v)]
    wrt = list(leaves)
    if table is not None:
        wrt.append(table)
    out, lse = fn(*leaves, **kw)
    grads = torch.autograd.grad(out, wrt, dout.to(device, out.dtype))
    return out.detach().cpu(), lse.detach().cpu(), [g.cpu() for g in grads]


def _ours(q, k, v, **kw):
    out, lse, _ = ioattn.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    return out, lse


def _oracle(q, k, v, **kw):
    return attention_ref(q, k, v, upcast=q.dtype == F64, **kw)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("case", list(CASES))
def test_library_matches_the_oracle(case, backend):
    """GQA 4:2, seqlen_q < seqlen_k; forward, lse and every gradient, the bias table's too."""
    q, k, v, dout = _inputs(seed=len(case))
    has_table = case in _WITH_TABLE
    tab = _table().to(DEVICE).requires_grad_(True) if has_table else None
    with dispatch.forced_backend(backend):
        out, lse, grads = _run(_ours, q, k, v, dout, F16, DEVICE, tab, **CASES[case](tab, DEVICE))
    tab64 = _table(F64).requires_grad_(True) if has_table else None
    out64, lse64, grads64 = _run(_oracle, q, k, v, dout, F64, "cpu", tab64, **CASES[case](tab64, "cpu"))
    tab16 = _table().requires_grad_(True) if has_table else None
    out16, _, grads16 = _run(_oracle, q, k, v, dout, F16, "cpu", tab16, **CASES[case](tab16, "cpu"))
    assert_within_torch_error("out", out, out64, out16)
    for name, g, g64, g16 in zip(("dq", "dk", "dv", "dtable"), grads, grads64, grads16):
        assert_within_torch_error(name, g, g64, g16, floor=1e-4)
    finite = torch.isfinite(lse64)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[finite].double() - lse64[finite]).abs().max() < 1e-3


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_varlen_positions_are_per_sequence(backend):
    """Packed sequences: ``b`` is the sequence, positions start at 0 in each; bottom-right causal
    from per-sequence lengths (captured tensors indexed by ``b``), and a bias table's gradient."""
    lens_q, lens_k = [13, 1, 22], [20, 9, 22]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v, dout = _inputs(5, sq=int(cu_q[-1]), sk=int(cu_k[-1]), lead=())
    mask = M.bottom_right_causal(torch.tensor(lens_q), torch.tensor(lens_k))
    on_device = M.bottom_right_causal(torch.tensor(lens_q, device=DEVICE), torch.tensor(lens_k, device=DEVICE))
    tab = _table().to(DEVICE).requires_grad_(True)

    def ours(q, k, v):
        out, lse, _ = ioattn.flash_attn_varlen_func(q, k, v, cu_q.to(DEVICE), cu_k.to(DEVICE), max(lens_q),
                                                     max(lens_k), mask_mod=on_device, score_mod=M.relative_bias(tab),
                                                     return_attn_probs=True)
        return out, lse

    with dispatch.forced_backend(backend):
        out, lse, grads = _run(ours, q, k, v, dout, torch.float32, DEVICE, tab)
    tab64 = _table(F64).requires_grad_(True)
    outs, grads64 = [], None
    for b in range(3):
        sq, sk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        o, _ = attention_ref(q[None, sq], k[None, sk], v[None, sk], mask_mod=mask, b_offset=b,
                             score_mod=M.relative_bias(tab64))
        outs.append(o[0])
    out64 = torch.cat(outs)
    assert (out.double() - out64).abs().max() < 1e-5
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    outs = []
    for b in range(3):
        sq, sk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        o, _ = attention_ref(qq[None, sq], kk[None, sk], vv[None, sk], mask_mod=mask, b_offset=b,
                             score_mod=M.relative_bias(tab64))
        outs.append(o[0])
    grads64 = torch.autograd.grad(torch.cat(outs), (qq, kk, vv, tab64), dout)
    for name, g, g64 in zip(("dq", "dk", "dv", "dtable"), grads, grads64):
        assert (g.double() - g64).abs().max() < 1e-4, name
    assert lse.shape == (H, int(cu_q[-1]))


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_block_masks_in_packed_sequences(backend):
    """A block mask over packed sequences (``B`` the sequence count, the lengths their maxima): a
    per-sequence prefix-LM mask, GQA; each sequence against the oracle at its own positions, forward
    and gradients."""
    lens = [40, 17, 33]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v, dout = _inputs(21, sq=int(cu[-1]), sk=int(cu[-1]), lead=())
    mask = M.prefix_lm(torch.tensor([5, 9, 3], device=DEVICE))
    bm = create_block_mask(mask, 3, None, max(lens), max(lens), device=DEVICE, BLOCK_SIZE=16)

    def ours(q, k, v):
        out, lse, _ = ioattn.flash_attn_varlen_func(q, k, v, cu.to(DEVICE), cu.to(DEVICE), max(lens), max(lens),
                                                     block_mask=bm, return_attn_probs=True)
        return out, lse

    with dispatch.forced_backend(backend):
        out, _, grads = _run(ours, q, k, v, dout, torch.float32, DEVICE, None)
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    cpu_mask = M.prefix_lm(torch.tensor([5, 9, 3]))
    outs = []
    for b in range(3):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        o, _ = attention_ref(qq[None, rows], kk[None, rows], vv[None, rows], mask_mod=cpu_mask, b_offset=b)
        outs.append(o[0])
    out64 = torch.cat(outs)
    grads64 = torch.autograd.grad(out64, (qq, kk, vv), dout)
    assert (out.double() - out64).abs().max() < 1e-5
    for name, g, g64 in zip(("dq", "dk", "dv"), grads, grads64):
        assert (g.double() - g64).abs().max() < 1e-4, name


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_sinks_with_functions(backend):
    """Learnable sinks beside a score function with a learnable table and a mask function: the sinks'
    and the table's gradients with the inputs'."""
    q, k, v, dout = _inputs(23)
    g = torch.Generator().manual_seed(23)
    sinks64 = (torch.randn(H, generator=g, dtype=F64) * 2).requires_grad_(True)
    tab64 = _table(F64).requires_grad_(True)
    sinks, tab = (t.detach().float().requires_grad_(True) for t in (sinks64, tab64))

    def ours(q, k, v):
        out, lse, _ = ioattn.flash_attn_func(q, k, v, sinks=sinks.to(DEVICE), score_mod=M.relative_bias(tab.to(DEVICE)),
                                             mask_mod=M.sliding_window(9, 2, offset=SK - SQ),
                                             return_attn_probs=True)
        return out, lse

    with dispatch.forced_backend(backend):
        leaves = [t.to(DEVICE, torch.float32).requires_grad_(True) for t in (q, k, v)]
        out, _ = ours(*leaves)
        grads = torch.autograd.grad(out, [*leaves, sinks, tab], dout.to(DEVICE, out.dtype))
    leaves64 = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out64, _ = attention_ref(*leaves64, sinks=sinks64, score_mod=M.relative_bias(tab64),
                             mask_mod=M.sliding_window(9, 2, offset=SK - SQ))
    grads64 = torch.autograd.grad(out64, [*leaves64, sinks64, tab64], dout)
    assert (out.cpu().double() - out64).abs().max() < 1e-5
    for name, g, g64 in zip(("dq", "dk", "dv", "dsinks", "dtable"), grads, grads64):
        assert (g.cpu().double() - g64).abs().max() < 2e-4, name


def _random_layout(seed, nq, nk, p):
    g = torch.Generator().manual_seed(seed)
    layout = torch.rand(B, H, nq, nk, generator=g) < p
    layout[0, 0, 0] = False  # a query block with no key block: its rows give zeros and lse -inf
    layout[1, 1] = True      # a head with every block
    return layout


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_block_sparse_layouts(backend):
    """FlashAttention-1's block-sparse attention: random layouts per (batch, head), an empty query
    block row, an all-full head; 16-row blocks so the kernels' tiles split them."""
    nq, nk, bs = -(-SQ // 16), -(-SK // 32), (16, 32)
    layout = _random_layout(3, nq, nk, 0.5)
    bm = block_sparse_mask(layout.to(DEVICE), SQ, SK, bs)
    q, k, v, dout = _inputs(9)
    dense = layout.repeat_interleave(bs[0], -2).repeat_interleave(bs[1], -1)[..., :SQ, :SK]

    def mask(b, h, q_idx, kv_idx):
        return dense[b, h, q_idx, kv_idx]

    with dispatch.forced_backend(backend):
        out, lse, grads = _run(_ours, q, k, v, dout, F16, DEVICE, None, block_mask=bm)
    out64, lse64, grads64 = _run(_oracle, q, k, v, dout, F64, "cpu", None, mask_mod=mask)
    out16, _, grads16 = _run(_oracle, q, k, v, dout, F16, "cpu", None, mask_mod=mask)
    assert_within_torch_error("out", out, out64, out16)
    for name, g, g64, g16 in zip(("dq", "dk", "dv"), grads, grads64, grads16):
        assert_within_torch_error(name, g, g64, g16)
    assert (out[0, :16, 0] == 0).all() and torch.isneginf(lse[0, 0, :16]).all()
    assert torch.equal(torch.isfinite(lse), torch.isfinite(lse64))


@pytest.mark.interpreter
def test_block_mask_classes_lists_and_picture():
    """create_block_mask's classes equal a dense evaluation; the row and column lists list every
    non-empty block once, ascending; the picture and the sparsity say what the lists hold."""
    mask = M.document_mask(_DOCS.to(DEVICE), M.causal_mask)
    bm = create_block_mask(mask, None, None, SK, SK, device=DEVICE, BLOCK_SIZE=16)
    dense = _classify_dense(M.trace(mask, "mask"), 1, 1, SK, SK, 16, 16, DEVICE).cpu()
    assert torch.equal(bm.classes().cpu(), dense)
    classes = dense[0, 0]
    for i in range(classes.shape[0]):
        n = int(bm.kv_num_blocks[0, 0, i])
        assert bm.kv_indices[0, 0, i, :n].tolist() == (classes[i] == 1).nonzero().flatten().tolist()
        nf = int(bm.full_kv_num_blocks[0, 0, i])
        assert bm.full_kv_indices[0, 0, i, :nf].tolist() == (classes[i] == 2).nonzero().flatten().tolist()
    for j in range(classes.shape[1]):
        n = int(bm.q_num_blocks[0, 0, j])
        assert bm.q_indices[0, 0, j, :n].tolist() == (classes[:, j] == 1).nonzero().flatten().tolist()
    empty = int((classes == 0).sum())
    assert bm.sparsity() == pytest.approx(100.0 * empty / classes.numel())
    picture = bm.to_string().splitlines()
    assert picture[1:] == ["".join(".+#"[int(c)] for c in row) for row in classes]


@pytest.mark.interpreter
def test_block_mask_with_its_function_matches_the_oracle():
    """A mask function's block mask (the partial blocks evaluate it, the full ones run without) gives
    the function's attention; per-batch masks (B given) too."""
    q, k, v, dout = _inputs(13, sq=SK)
    def padded_causal(lengths):  # batch entry 1: keys past 29 are padding
        def padded_causal(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (kv_idx < lengths[b])
        return padded_causal

    bm = create_block_mask(padded_causal(torch.tensor([SK, 29], device=DEVICE)), B, None, SK, SK, device=DEVICE,
                           BLOCK_SIZE=(16, 32))
    out, lse, grads = _run(_ours, q, k, v, dout, torch.float32, DEVICE, None, block_mask=bm)
    out64, lse64, grads64 = _run(_oracle, q, k, v, dout, F64, "cpu", None,
                                 mask_mod=padded_causal(torch.tensor([SK, 29])))
    assert (out.double() - out64).abs().max() < 1e-5
    for g, g64 in zip(grads, grads64):
        assert (g.double() - g64).abs().max() < 1e-5


def test_bad_functions_are_refused_before_any_launch():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(TypeError, match="mask_mod float_mask must return booleans"):
        def float_mask(b, h, q_idx, kv_idx):
            return (q_idx - kv_idx).float()
        ioattn.flash_attn_func(q, q, q, mask_mod=float_mask)
    with pytest.raises(TypeError, match="score_mod row_sum must return a score of the score's shape"):
        def row_sum(score, b, h, q_idx, kv_idx):
            return score.sum(-1, keepdim=True)
        ioattn.flash_attn_func(q, q, q, score_mod=row_sum)
    with pytest.raises(ValueError, match="could not be traced over tensors"):
        def branchy(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx if int(h) == 0 else q_idx > kv_idx
        ioattn.flash_attn_func(q, q, q, mask_mod=branchy)
    with pytest.raises(ValueError, match="cannot compile"):
        def sorted_keys(score, b, h, q_idx, kv_idx):
            return score + torch.cumsum(score, -1) * 0
        ioattn.flash_attn_func(q, q, q, score_mod=sorted_keys)
    with pytest.raises(TypeError, match="mask_mod must be a function"):
        ioattn.flash_attn_func(q, q, q, mask_mod=3)


def test_bad_block_masks_and_combinations_are_refused():
    q = torch.randn(2, 32, 2, 16)
    bm = create_block_mask(M.causal_mask, None, None, 32, 48, BLOCK_SIZE=16)
    with pytest.raises(ValueError, match=r"block_mask was built for \(seqlen_q, seqlen_k\) = \(32, 48\)"):
        ioattn.flash_attn_func(q, q, q, block_mask=bm)
    bm = create_block_mask(M.causal_mask, 3, None, 32, 32, BLOCK_SIZE=16)
    with pytest.raises(ValueError, match="built for batch 3"):
        ioattn.flash_attn_func(q, q, q, block_mask=bm)
    bm = create_block_mask(M.causal_mask, None, None, 32, 32, BLOCK_SIZE=16)
    with pytest.raises(ValueError, match="block_mask with causal=True"):
        ioattn.flash_attn_func(q, q, q, block_mask=bm, causal=True)
    with pytest.raises(ValueError, match="mask_mod and block_mask's mask function differ"):
        ioattn.flash_attn_func(q, q, q, block_mask=bm, mask_mod=M.prefix_lm(3))
    with pytest.raises(ValueError, match="not supported with dropout"):
        ioattn.flash_attn_func(q, q, q, mask_mod=M.causal_mask, dropout_p=0.1)
    with pytest.raises(ValueError, match="ambiguous"):
        ioattn.flash_attn_func(q, q, q, score_mod=M.softcap(2.0), softcap=3.0)
    with pytest.raises(ValueError, match="BLOCK_SIZE must be a power of two"):
        create_block_mask(M.causal_mask, None, None, 32, 32, BLOCK_SIZE=24)
    with pytest.raises(ValueError, match=r"layout must have \(2, 2\) blocks"):
        block_sparse_mask(torch.ones(3, 2, dtype=torch.bool), 32, 32, 16)
    on_meta = torch.zeros(4, device="meta")
    mod = dataclasses.replace(M.trace(M.causal_mask, "mask"), captures=(on_meta,))  # a copy: the trace is cached
    with pytest.raises(ValueError, match="captures a tensor of shape \\(4,\\) on meta"):
        mod.check_device(torch.device("cpu"))


def test_traced_functions_are_reused_and_follow_their_captures():
    """One trace per function and captured tensors' shapes: the same code around a new tensor of the same
    shape reuses the graph and the generated module with the new tensor; another shape or a one-element
    tensor (which the trace may make a literal) traces anew."""
    tab = _table()
    first = M.trace(M.relative_bias(tab), "score")
    assert M.trace(M.relative_bias(tab), "score") is first
    other = _table()
    again = M.trace(M.relative_bias(other), "score")
    assert again.captures[0] is other and again.graph is first.graph and again.key == first.key
    assert M.trace(M.relative_bias(_table()[:, :7]), "score").graph is not first.graph
    one = M.trace(M.alibi(torch.tensor([0.5])), "score")
    assert M.trace(M.alibi(torch.tensor([0.25])), "score").graph is not one.graph


@pytest.mark.interpreter
def test_a_function_rebuilt_around_new_tensors_reads_them():
    """A document mask rebuilt for the next packing (same length, other boundaries) reuses the trace and
    masks by its own ids."""
    q, k, v, dout = _inputs(seed=3, sk=SQ)
    for cuts in ([0, 15, 40], [0, 31, 40]):
        ids = M.document_ids(torch.tensor(cuts))
        with dispatch.forced_backend("triton"):
            out, _, _ = _run(_ours, q, k, v, dout, F16, DEVICE, None, mask_mod=M.document_mask(ids.to(DEVICE)))
        out64, _, _ = _run(_oracle, q, k, v, dout, F64, "cpu", None, mask_mod=M.document_mask(ids))
        out16, _, _ = _run(_oracle, q, k, v, dout, F16, "cpu", None, mask_mod=M.document_mask(ids))
        assert_within_torch_error("out", out, out64, out16)


def _key_bias(table):
    def key_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, kv_idx]
    return key_bias


@pytest.mark.interpreter
def test_one_kernel_serves_captured_tensors_of_every_size():
    """A captured tensor's sizes are read at run time: a per-key bias table over two key lengths (its
    row stride differs) runs one generated module, and each call is right."""
    keys = set()
    for sk in (SK, SK + 24):
        q, k, v, dout = _inputs(seed=sk, sk=sk)
        table = torch.randn(H, sk, generator=torch.Generator().manual_seed(sk), dtype=F64)
        keys.add(M.trace(_key_bias(table.float()), "score").key)
        with dispatch.forced_backend("triton"):
            out, _, _ = _run(_ours, q, k, v, dout, F16, DEVICE, None,
                             score_mod=_key_bias(table.float().to(DEVICE)))
        out64, _, _ = _run(_oracle, q, k, v, dout, F64, "cpu", None, score_mod=_key_bias(table))
        out16, _, _ = _run(_oracle, q, k, v, dout, F16, "cpu", None, score_mod=_key_bias(table.float()))
        assert_within_torch_error("out", out, out64, out16)
    assert len(keys) == 1, keys


@pytest.mark.interpreter
def test_explain_dispatch_shows_the_functions_and_the_block_mask():
    q = torch.randn(2, 64, 2, 16, device=DEVICE)
    bm = create_block_mask(M.sliding_window(20), None, None, 64, 64, device=DEVICE, BLOCK_SIZE=16)
    plan = ioattn.explain_dispatch(q, q, q, block_mask=bm,
                                   score_mod=M.relative_bias(_table().to(DEVICE).requires_grad_()))
    text = plan.describe()
    assert f"{bm.sparsity():.1f}% of the 16 blocks skipped" in text
    assert "sliding_window_mask" in text and "relative_bias_mod (1 captured tensors, 1 with gradients)" in text
    assert plan.backward["atomics"] and plan.forward["gluon_hopper"].startswith("not taken")  # (head dim 16)


def test_under_torch_compile_the_call_runs_eagerly():
    """A graph break around the call (the library traces the functions itself): the compiled
    function equals the eager one; fullgraph=True refuses it."""
    q = torch.randn(1, 32, 2, 16)
    compiled = torch.compile(lambda q: ioattn.flash_attn_func(q, q, q, mask_mod=M.causal_mask))
    assert (compiled(q) - ioattn.flash_attn_func(q, q, q, causal=True)).abs().max() < 1e-5
    with pytest.raises(Exception, match="disable"):
        torch.compile(lambda q: ioattn.flash_attn_func(q, q, q, mask_mod=M.causal_mask), fullgraph=True)(q)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_functions_with_a_value_head_dim_of_its_own(backend):
    """A score and a mask function with V's head dim (24) other than Q's and K's (16)."""
    q, k, _, _ = _inputs(17)
    g = torch.Generator().manual_seed(18)
    v = torch.randn(B, SK, HK, 24, generator=g, dtype=F64)
    dout = torch.randn(B, SQ, H, 24, generator=g, dtype=F64)
    kw = dict(mask_mod=M.causal_mask, score_mod=M.softcap(3.0))
    with dispatch.forced_backend(backend):
        out, lse, grads = _run(_ours, q, k, v, dout, torch.float32, DEVICE, None, **kw)
    out64, _, grads64 = _run(_oracle, q, k, v, dout, F64, "cpu", None, **kw)
    assert out.shape == (B, SQ, H, 24) and (out.double() - out64).abs().max() < 1e-5
    for g_, g64 in zip(grads, grads64):
        assert (g_.double() - g64).abs().max() < 1e-5


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_library_functions_with_a_builtin_form_take_the_builtin_kernels(backend):
    """The library's causal masks, sliding windows aligned bottom-right, softcap and ALiBi (slopes
    without a gradient) run as window_size / softcap / alibi_slopes: the same numbers as those
    arguments, bitwise, and explain_dispatch says so; a function of the user's own with the same mask
    runs the portable kernels and agrees within rounding; a block mask of the same library function too."""
    q, k, v, _ = _inputs(23)
    q, k, v = (t.to(DEVICE, torch.float32) for t in (q, k, v))
    slopes = torch.linspace(0.1, 0.9, H, device=DEVICE)
    cases = [(dict(mask_mod=M.bottom_right_causal(SQ, SK)), dict(causal=True)),
             (dict(mask_mod=M.sliding_window(7, 3, SK - SQ), score_mod=M.softcap(2.0)),
              dict(window_size=(7, 3), softcap=2.0)),
             (dict(score_mod=M.alibi(slopes, SK - SQ)), dict(alibi_slopes=slopes)),
             (dict(block_mask=create_block_mask(M.bottom_right_causal(SQ, SK), None, None, SQ, SK, device=DEVICE,
                                                BLOCK_SIZE=16)), dict(causal=True))]
    with dispatch.forced_backend(backend):
        for mods_kw, builtin_kw in cases:
            assert torch.equal(ioattn.flash_attn_func(q, k, v, **mods_kw), ioattn.flash_attn_func(q, k, v, **builtin_kw))
            assert "built-in form" in ioattn.explain_dispatch(q, k, v, **mods_kw).forward["mods"]

        def own_causal(b, h, q_idx, kv_idx):
            return q_idx + (SK - SQ) >= kv_idx
        assert "mods" not in ioattn.explain_dispatch(q, k, v, mask_mod=own_causal).forward
        diff = ioattn.flash_attn_func(q, k, v, mask_mod=own_causal) - ioattn.flash_attn_func(q, k, v, causal=True)
        assert diff.abs().max() < 1e-5


@pytest.mark.parametrize("kind", ["causal", "sliding_window", "prefix_lm", "document", "alibi", "softcap",
                                  "block_sparse"])
def test_the_mods_benchmark_builds_what_it_claims(kind, monkeypatch):
    """``ioattn bench mods``'s problems, small: each kind's ioattn call and its built-in twin (the
    varlen call over the packed documents of every batch entry, dense attention for the sparse
    layout) against the float64 oracle of the kind's functions, and the density it counts."""
    from ioattn.bench import mods_bench as mb

    monkeypatch.setattr(mb, "WINDOW", 24)
    monkeypatch.setattr(mb, "PREFIX", 20)
    monkeypatch.setattr(mb, "BLOCK", 32)
    n, d, nheads, batch = 128, 16, 2, 2
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(batch, n, nheads, d, generator=g).to(DEVICE) for _ in range(3))
    fns, refs = mb._providers(kind, ["ioattn", "ioattn-builtin"], n, batch, nheads, DEVICE)
    ok, err = mb._check(fns["ioattn"], q, k, v, refs)
    assert ok, (kind, err)
    if kind == "block_sparse":  # the twin is dense attention: the ideal's baseline, not the same function
        assert 0.0 < mb._density(kind, n, refs, DEVICE) < 1.0
    elif "ioattn-builtin" in fns:
        assert (fns["ioattn-builtin"](q, k, v) - fns["ioattn"](q, k, v)).abs().max() < 1e-4, kind
    assert 0.0 < mb._density(kind, n, refs, DEVICE) <= 1.0


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_a_mask_function_with_the_builtin_softcap_and_alibi(backend):
    """``mask_mod`` beside ``softcap`` and per-batch ``alibi_slopes`` (the kernels' own forms; the CPU path
    takes them as ``mods.softcap`` / ``mods.alibi`` with per-batch slopes): the oracle's numbers."""
    q, k, v, dout = _inputs(29)
    slopes = torch.rand(B, H, generator=torch.Generator().manual_seed(30))
    kw = dict(mask_mod=M.prefix_lm(9), softcap=4.0)
    with dispatch.forced_backend(backend):
        out, _, grads = _run(_ours, q, k, v, dout, torch.float32, DEVICE, None, alibi_slopes=slopes.to(DEVICE), **kw)
    out64, _, grads64 = _run(_oracle, q, k, v, dout, F64, "cpu", None, alibi_slopes=slopes.double(), **kw)
    assert (out.double() - out64).abs().max() < 1e-5
    for g, g64 in zip(grads, grads64):
        assert (g.double() - g64).abs().max() < 1e-5


def test_gluon_plan_for_functions_and_block_masks():
    """Which calls the Gluon ping-pong forward takes with functions (pure Python), and its plan: 64-key
    tiles where a function captures a tensor, 128-key tiles where none does (and the block mask's key
    block is a multiple of them), a block mask's blocks as SUB tiles, no built-in mask (the functions mask
    the key end), the softmax's scale log2 e after a score function (which gets the scaled score)."""
    from ioattn.kernels.constants import LOG2E
    from ioattn.plan import forward as forward_plan
    from ioattn.semantics import Semantics

    q = torch.empty(2, 1000, 4, 128, dtype=torch.bfloat16, device="meta")
    plain = Semantics(128 ** -0.5)
    for captures in (True, False):
        assert mods_plan.call_supported(q, q, q, False, plain, (128, 128), captures) == (
            True, "the Gluon ping-pong forward")
    for args, match in (((q.float(), q.float(), q.float(), False, plain, None), "fp16/bf16"),
                        ((q[..., :96], q[..., :96], q[..., :96], False, plain, None), "head dims"),
                        ((q, q, q, True, plain, None), "fixed lengths"),
                        ((q, q, q, False, Semantics(0.1, (-1, 0)), None), "built-in masks"),
                        ((q, q, q, False, plain, (128, 32)), "multiples of its 128 x 64 tiles")):
        ok, why = mods_plan.call_supported(*args, True)
        assert not ok and match in why, why
    # 64-row query blocks: regrouped into the tile's rows where a mask function masks the merged blocks
    assert mods_plan.call_supported(q, q, q, False, plain, (64, 128), True)[0]
    ok, why = mods_plan.call_supported(q, q, q, False, plain, (64, 128), True, exact=False)
    assert not ok and "multiples of its 128 x 64 tiles" in why, why
    with hopper.prefer_hopper(False):
        assert mods_plan.fwd_plan(q, q, q, False, plain, None, False) == (
            False, "prefer_hopper(False): the portable kernels")
    assert mods_plan.tiles(128, True, None) == mods_plan.TILES[128] == (128, 64, 3)
    assert mods_plan.tiles(128, False, (128, 128)) == mods_plan.WIDE_TILES[128] == (128, 128, 2)
    assert mods_plan.tiles(128, False, (128, 64)) == (128, 64, 3)  # 64-key blocks: the narrow tiles
    assert mods_plan.tiles(256, False, None) == mods_plan.TILES[256]  # no wide tiles at d = 256
    sig = forward_plan.Signature(batch=2, seqlen_q=1000, seqlen_k=1000, nheads=4, nheads_kv=2, head_dim=128,
                                 element_size=2, varlen=False, causal=False, window=(-1, -1), softcap=0.0,
                                 softmax_scale=-0.1, alibi=False, device_sms=132)
    plan = forward_plan.plan_forward_mods(sig, True, (256, 128), True)
    c = dict(plan.constexprs)
    assert (plan.block_m, plan.block_n, c["SUB"], c["Q_BLOCK"], c["STAGES"]) == (128, 64, 2, 256, 3)
    assert c["KV_TAIL"] and c["KEY_MASKS"] and not (c["IS_CAUSAL"] or c["WINDOW"] or c["PERSISTENT"])
    assert plan.qk_scale == LOG2E and not plan.negate_q
    # a block mask's rows in the causal walk's order (the last query blocks first, over the grid), no mask
    assert c["LONGEST_FIRST"] and c["LPT"] and plan.walk_div == sig.batch * sig.nheads
    wide = dict(forward_plan.plan_forward_mods(sig, True, (256, 128), False).constexprs)
    assert (wide["BLOCK_N"], wide["SUB"], wide["STAGES"]) == (128, 1, 2)
    masked_only = forward_plan.plan_forward_mods(sig, False, None, True)  # the lean softmax's sign flip for a negative scale
    assert dict(masked_only.constexprs)["SUB"] == 1 and masked_only.negate_q == dict(masked_only.constexprs)["LEAN"]
    assert not dict(masked_only.constexprs)["LONGEST_FIRST"]  # every tile a row: any order
    aligned = forward_plan.plan_forward_mods(dataclasses.replace(sig, seqlen_k=1024), False, None, True)
    assert not dict(aligned.constexprs)["KEY_MASKS"]


def test_gluon_plan_takes_three_warpgroups_at_d64_where_the_lists_regroup():
    """d = 64 (``plan.mods.WG3_TILES``): three consumer warpgroups (192 query rows, 64-key tiles) where no
    function captures a tensor and a block mask comes from a mask function, whose lists the kernel walks
    regrouped into 192-row query blocks (``Q_BLOCK``); a block-sparse layout (no mask function to mask a
    merged block) and captures keep the two-warpgroup tiles."""
    from ioattn.plan import forward as forward_plan
    from ioattn.semantics import Semantics

    q = torch.empty(2, 1000, 4, 64, dtype=torch.bfloat16, device="meta")
    assert mods_plan.tiles(64, False, (128, 128)) == mods_plan.WG3_TILES[64] == (192, 64, 3)
    assert mods_plan.tiles(64, False, None) == (192, 64, 3)
    assert mods_plan.tiles(64, False, (128, 128), exact=False) == mods_plan.WIDE_TILES[64]
    assert mods_plan.tiles(64, True, (128, 128)) == mods_plan.TILES[64]
    assert mods_plan.q_block(192, (128, 128)) == 192 and mods_plan.q_block(192, (384, 128)) == 384
    assert mods_plan.q_block(128, (256, 128)) == 256 and mods_plan.q_block(192, None) == 0
    assert mods_plan.call_supported(q, q, q, False, Semantics(0.125), (128, 128), False) == (
        True, "the Gluon ping-pong forward")
    sig = forward_plan.Signature(batch=2, seqlen_q=1000, seqlen_k=1000, nheads=4, nheads_kv=2, head_dim=64,
                                 element_size=2, varlen=False, causal=False, window=(-1, -1), softcap=0.0,
                                 softmax_scale=0.125, alibi=False, device_sms=132)
    for exact, want in ((True, (3, 192, 64, 2, 192, 3)), (False, (2, 128, 128, 1, 128, 3))):
        plan = forward_plan.plan_forward_mods(sig, False, (128, 128), False, exact)
        c = dict(plan.constexprs)
        got = (c["NUM_WG"], plan.block_m, plan.block_n, c["SUB"], c["Q_BLOCK"], c["STAGES"])
        assert got == want and plan.q_rows == 64 and plan.num_m == -(-1000 // plan.block_m), (exact, got)
        assert c["LONGEST_FIRST"] and not c["IS_CAUSAL"]


@pytest.mark.parametrize("mask", ["causal", pytest.param("document", marks=pytest.mark.interpreter), "prefix"])
def test_regrouped_block_mask_lists_are_sound_and_run(mask):
    """``BlockMask.regrouped(rows)``: query blocks of ``rows`` (192, the Gluon kernel's three-warpgroup
    tile) from 128-row ones; a merged block is full or empty only where every row of it is (checked
    against the dense mask), so the mask function covers the rest; the portable kernel walking the
    regrouped lists matches the oracle; a block-sparse layout is refused."""
    from ioattn.block_mask import EMPTY, FULL

    n, rows = 500, 192

    def function(dev):
        docs = torch.repeat_interleave(torch.arange(4), torch.tensor([150, 50, 200, 100])).to(dev)
        return {"causal": M.causal_mask, "document": M.document_mask(docs, M.causal_mask),
                "prefix": M.prefix_lm(100)}[mask]
    bm = create_block_mask(function(DEVICE), None, None, n, n, device=DEVICE, BLOCK_SIZE=128)
    rg = bm.regrouped(rows)
    assert rg is bm.regrouped(rows) and rg.block_size == (rows, 128) and rg.mask_mod is bm.mask_mod
    dense = M.dense_mask(M.trace(function("cpu"), "mask"), 1, 1, n, n, torch.device("cpu"))[0, 0]
    classes = rg.classes()[0, 0].cpu()
    assert classes.shape == (-(-n // rows), -(-n // 128))
    for (i, j), c in zip(torch.cartesian_prod(*map(torch.arange, classes.shape)).tolist(), classes.flatten()):
        block = dense[i * rows:(i + 1) * rows, j * 128:(j + 1) * 128]
        assert (c != FULL or block.all()) and (c != EMPTY or not block.any()), (i, j, int(c))
    assert int((classes == EMPTY).sum()) > 0
    with pytest.raises(ValueError, match="cannot be regrouped"):
        block_sparse_mask(torch.ones(4, 4, dtype=torch.bool, device=DEVICE), n, n).regrouped(rows)
    q, k, v, _ = _inputs(11, sq=n, sk=n, lead=(1,))
    out64 = _oracle(q, k, v, mask_mod=function("cpu"))[0]
    out16 = _oracle(*(t.to(F16) for t in (q, k, v)), mask_mod=function("cpu"))[0]
    with dispatch.forced_backend("triton"):
        out = ioattn.flash_attn_func(*(t.to(DEVICE, F16) for t in (q, k, v)), block_mask=rg)
    assert_within_torch_error(f"regrouped {mask}", out.cpu(), out64, out16)


_GLUON = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _gluon_case(case, table, docs, layout, sq, sk, dev):
    """(our call's keyword arguments on ``dev``, the oracle's on the CPU) of a Gluon test case; functions
    the library would run as built-in arguments are written as a user would, so the functions' path runs."""
    doc_causal = M.document_mask(docs.to(dev), M.causal_mask)
    dense = layout.repeat_interleave(128, -2).repeat_interleave(128, -1)[..., :sq, :sk]

    def sparse(b, h, q_idx, kv_idx):  # (a layout of one head serves them all)
        return dense[b, h % dense.shape[1], q_idx, kv_idx]

    def user_causal(b, h, q_idx, kv_idx):  # the library's own would run as causal=True
        return q_idx >= kv_idx

    capped = M.softcap(3.0)

    def user_softcap(score, b, h, q_idx, kv_idx):  # likewise softcap=3.0
        return capped(score, b, h, q_idx, kv_idx)

    t = table.to(dev, torch.float32)
    ours = {"causal": dict(mask_mod=user_causal), "document_causal": dict(mask_mod=doc_causal),
            "relative_bias": dict(score_mod=M.relative_bias(t)),
            "bias_and_causal": dict(score_mod=M.relative_bias(t), mask_mod=user_causal),
            "softcap": dict(score_mod=user_softcap),
            "block_mask": dict(block_mask=create_block_mask(doc_causal, None, None, sq, sk, device=dev)),
            "causal_block_mask": dict(block_mask=create_block_mask(user_causal, None, None, sq, sk, device=dev)),
            "block_sparse": dict(block_mask=block_sparse_mask(layout.to(dev), sq, sk, 128))}[case]
    oracle = {"block_mask": dict(mask_mod=M.document_mask(docs, M.causal_mask)),
              "causal_block_mask": dict(mask_mod=user_causal), "block_sparse": dict(mask_mod=sparse)}.get(case)
    if oracle is None:
        oracle = {key: (M.relative_bias(table) if key == "score_mod" and case in ("relative_bias", "bias_and_causal")
                        else M.document_mask(docs, M.causal_mask) if case == "document_causal" else fn)
                  for key, fn in ours.items()}
    return ours, oracle


@pytest.mark.skipif(not _GLUON, reason="the Gluon forward: an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", ["causal", "document_causal", "relative_bias", "bias_and_causal", "softcap",
                                  "block_mask", "causal_block_mask", "block_sparse"])
def test_gluon_forward_with_functions(case, d, poison_alloc):
    """The Gluon ping-pong forward with the library's functions and block masks (the default on sm_90)
    against the float64 oracle, bf16, GQA, a key tail (1000 keys), a query block with no key block; its
    plan the Gluon one (at d = 64 without captures: three warpgroups, a block mask's lists regrouped)."""
    sq = sk = 1000
    g = torch.Generator().manual_seed(d + len(case))
    q = torch.randn(2, sq, 4, d, generator=g, dtype=F64)
    k, v = (torch.randn(2, sk, 2, d, generator=g, dtype=F64) for _ in range(2))
    table = torch.randn(4, 2 * 12 + 1, generator=g, dtype=F64) * 0.5
    docs = torch.tensor([0] * 300 + [1] * 500 + [2] * 200, dtype=torch.int32)
    layout = torch.rand(2, 4, 8, 8, generator=g) < 0.4
    layout[0, 0, 3] = False
    ours, oracle = _gluon_case(case, table, docs, layout, sq, sk, torch.device("cuda"))
    _, oracle32 = _gluon_case(case, table.float(), docs, layout, sq, sk, torch.device("cuda"))  # the bf16 twin's
    bf = [t.to("cuda", torch.bfloat16) for t in (q, k, v)]
    plan = ioattn.explain_dispatch(*bf, **ours)
    assert plan.forward["gluon_hopper"].startswith("taken"), plan.forward
    if d == 64 and case in ("causal", "causal_block_mask"):
        assert dict(plan.forward["plan"].constexprs)["NUM_WG"] == 3, plan.forward
    out, lse, _ = ioattn.flash_attn_func(*bf, return_attn_probs=True, **ours)
    out64, lse64 = attention_ref(q, k, v, upcast=True, **oracle)
    outbf, _ = attention_ref(*(t.to(torch.bfloat16) for t in (q, k, v)), **oracle32)
    assert_within_torch_error("out", out.cpu(), out64, outbf)
    finite = torch.isfinite(lse64)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    assert (lse.cpu()[finite].double() - lse64[finite]).abs().max() < 2e-2


@pytest.mark.skipif(not _GLUON, reason="the Gluon backward: an sm_90 GPU")
@pytest.mark.parametrize("case", ["causal", "document_causal", "block_mask", "block_sparse", "relative_bias",
                                  "bias_and_causal", "softcap"])
@pytest.mark.parametrize("d", [64, 128])
def test_gluon_backward_with_functions(d, case, poison_alloc):
    """The Gluon ws backward with a mask function, a block mask or a score function (its table captured
    without a gradient) (d = 64 and 128, bf16, GQA 4:2, a key and query tail of 1000 rows, a query block
    with no key block) against autograd through the float64 oracle; its plan the Gluon one."""
    sq = sk = 1000
    g = torch.Generator().manual_seed(7 + len(case) + d)
    q = torch.randn(2, sq, 4, d, generator=g, dtype=F64)
    k, v = (torch.randn(2, sk, 2, d, generator=g, dtype=F64) for _ in range(2))
    dout = torch.randn(2, sq, 4, d, generator=g, dtype=F64)
    docs = torch.tensor([0] * 300 + [1] * 500 + [2] * 200, dtype=torch.int32)
    layout = torch.rand(2, 1, 8, 8, generator=g) < 0.4  # one layout for every head (a KV head's group shares it)
    layout[0, 0, 3] = False
    table = torch.randn(4, 25, generator=g, dtype=F64) * 0.5
    ours, oracle = _gluon_case(case, table, docs, layout, sq, sk, torch.device("cuda"))
    _, oracle32 = _gluon_case(case, table.float(), docs, layout, sq, sk, torch.device("cuda"))
    bf = [t.to("cuda", torch.bfloat16) for t in (q, k, v)]
    plan = ioattn.explain_dispatch(*bf, **ours)
    assert plan.backward["gluon_hopper"].startswith("taken"), plan.backward
    out, _, grads = _run(_ours, q, k, v, dout, torch.bfloat16, "cuda", None, **ours)
    out64, _, grads64 = _run(_oracle, q, k, v, dout, F64, "cpu", None, **oracle)
    outbf, _, gradsbf = _run(_oracle, q, k, v, dout, torch.bfloat16, "cpu", None, **oracle32)
    assert_within_torch_error("out", out, out64, outbf)
    for name, got, g64, gbf in zip(("dq", "dk", "dv"), grads, grads64, gradsbf):
        assert_within_torch_error(name, got, g64, gbf, floor=1e-4)


def test_the_mods_benchmark_times_the_portable_backward_inside_its_switch():
    """``ioattn-portable-bwd`` (the A/B of the Gluon backward with mask functions) carries the switch
    that keeps the backward portable, and the timing holds it around the backward too."""
    from ioattn.bench import mods_bench as mb
    from ioattn.plan import hopper_bwd

    fn = mb._providers("causal", ["ioattn-portable-bwd"], 256, 1, 2, DEVICE)[0]["ioattn-portable-bwd"]
    seen = []
    with fn.context():
        seen.append(hopper_bwd.prefer_hopper_bwd.value)
    assert seen == [False] and hopper_bwd.prefer_hopper_bwd.value is None


def test_the_mods_benchmark_times_the_block_mask_build():
    """``ioattn bench mods``'s block-mask build records (small, on this machine's device)."""
    from ioattn.bench import mods_bench as mb

    recs = mb.build_times(256, DEVICE, flex=False, reps=2)
    assert [r["provider"] for r in recs] == ["ioattn"] and recs[0]["sweep"] == "mods-build"
    assert recs[0]["ms"] > 0 and recs[0]["seqlen_q"] == 256



def test_the_mods_benchmark_records_a_provider_that_cannot_run_in_the_schema():
    """A provider that fails a point (FlexAttention out of memory, say) leaves a record the report
    reads: no time, not ok, the error named."""
    from ioattn.bench import mods_bench as mb, report

    base = dict(sweep="mods-document", provider="flex", dtype="bf16", batch=1, nheads=16, nheads_kv=16,
                headdim=128, seqlen_q=16384, seqlen_k=16384, causal=True, paged=False, device="x", density=0.1,
                command="ioattn bench mods", env={"torch": "x", "ioattn": "0123abcd"})
    rec = mb._failed(base, "fwd", MemoryError("16 GiB"))
    assert report.validate(rec) == [] and rec["ms"] is None and not rec["ok"]
    assert rec["error"] == "MemoryError: 16 GiB"


def test_gluon_backward_plan_for_mask_functions():
    """Which backward calls the Gluon ws kernel takes with functions (pure Python), and its plan: mask
    functions and block masks at d = 64 and 128, fixed lengths; the block mask's query blocks as SUB steps, its
    key block as KV_BLOCK, the padded stat rows whole query blocks of it; score functions, built-in
    forms, varlen, other head dims, per-head lists under GQA and misfit blocks refused by name; a score
    function's captured tensors that take gradients refused, a score function's plan in its units."""
    from ioattn.plan import backward as backward_plan
    from ioattn.semantics import Semantics

    q = torch.empty(2, 1000, 4, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, 1000, 2, 128, dtype=torch.bfloat16, device="meta")
    plain = Semantics(128 ** -0.5)
    assert mods_plan.bwd_call_supported(q, k, k, False, plain, (128, 128), False, True) == (True,
                                                                                            "the Gluon ws backward")
    for args, match in (((q, k, k, False, plain, None, True, True), "captured tensors' gradients"),
                        ((q, k, k, True, plain, None, False, True), "fixed lengths"),
                        ((q, k, k, False, Semantics(0.1, (-1, 0)), None, False, True), "built-in masks"),
                        ((q[..., :96], k[..., :96], k[..., :96], False, plain, None, False, True), "head dims"),
                        ((q, k, k, False, plain, (128, 128), False, False), "each head under GQA"),
                        ((q, k, k, False, plain, (128, 64), False, True), "multiples of its 64 x 128 tiles")):
        ok, why = mods_plan.bwd_call_supported(*args)
        assert not ok and match in why, why
    assert mods_plan.bwd_call_supported(q, q, q, False, plain, (128, 128), False, False)[0]  # no GQA: own lists
    with hopper.prefer_hopper(False):
        assert not mods_plan.bwd_plan(q, k, k, False, plain, None, False, True)[0]
    sig = backward_plan.BackwardSignature(batch=2, seqlen_q=1000, seqlen_k=900, nheads=4, nheads_kv=2, head_dim=128,
                                          varlen=False, causal=False, window=(-1, -1), softcap=0.0,
                                          softmax_scale=0.1, alibi=False, deterministic=False, longest=1000)
    plan = backward_plan.plan_backward_mods(sig, (256, 128))
    c = dict(plan.constexprs)
    assert (plan.block_m, plan.block_n, c["SUB"], c["KV_BLOCK"], plan.stat_stride) == (64, 128, 4, 128, 1024)
    assert not (c["IS_CAUSAL"] or c["WINDOW"] or c["IS_VARLEN"] or c["DETERMINISTIC"] or c["COL_SPLIT"])
    plain_plan = backward_plan.plan_backward_mods(sig, None)
    assert dict(plain_plan.constexprs)["SUB"] == 1 and plain_plan.stat_stride == 1024  # (1000 rows in 64s)
    # d = 64: 64 query rows a step with functions (the built-in backward's 128 spilled with them)
    q64, k64 = (torch.empty(*t.shape[:3], 64, dtype=torch.bfloat16, device="meta") for t in (q, k))
    assert mods_plan.bwd_call_supported(q64, k64, k64, False, plain, (128, 128), False, True)[0]
    sig64 = dataclasses.replace(sig, head_dim=64)
    assert (backward_plan.plan_backward_mods(sig64, (128, 128)).block_m, backward_plan.plan_backward(sig64).block_m) \
        == (64, 128)
    with pytest.raises(ValueError, match="multiples"):
        backward_plan.plan_backward_mods(sig, (96, 128))
    # a score function: the scores reach the exponentials in its units (log2 e scales them, lse in log2),
    # never through S^T's accumulator
    from ioattn.kernels.constants import LOG2E
    scored = backward_plan.plan_backward_mods(sig, None, score=True)
    assert (scored.qk_scale, scored.lse_unit, dict(scored.constexprs)["LSE_IN_ACC"]) == (LOG2E, LOG2E, False)
    assert plain_plan.qk_scale == pytest.approx(0.1 * LOG2E)


def test_gluon_backward_launch_with_a_mask_function(monkeypatch):
    """What the launch passes the Gluon backward for a call with a mask function and its block mask (a
    fake stands in for the ws kernel: no GPU here): the mask function as a compile-time argument, SUB and
    KV_BLOCK, and at each call the function's captures and the block mask's transposed lists."""
    import ioattn.launch.gluon_bwd as gb
    from ioattn import backends
    from ioattn.modcall import ModCall
    from ioattn.plan import backward as backward_plan

    launches = fake_launches(monkeypatch, gb, "hopper_bwd_ws_kernel")
    n, d = 1000, 128
    q, out, dout = (torch.randn(2, n, 4, d).to(DEVICE, torch.bfloat16) for _ in range(3))
    k = torch.randn(2, n, 2, d).to(DEVICE, torch.bfloat16)
    lse = torch.randn(2, 4, n).to(DEVICE)
    docs = torch.tensor([0] * 300 + [1] * 700, dtype=torch.int32).to(DEVICE)
    bm = create_block_mask(M.document_mask(docs, M.causal_mask), None, None, n, n, BLOCK_SIZE=128, device=DEVICE)
    call = ModCall.make(None, None, bm)
    assert call.heads_share_lists()
    sig = backends.backward_signature(q, k, d ** -0.5, False)
    plan = backward_plan.plan_backward_mods(sig, call.block_size())
    launch = gb.BackwardLaunch(plan, dout, q, k, k, out, lse, cached=False, functions=call.backward_functions())
    dq, dk, dv = launch(dout, q, k, k, out, lse, mod_args=call.gluon_backward_args())
    ((grid, _, kw),) = [x for x in launches if "MASK_MOD" in x[2]]
    assert grid == plan.grid == (8, 2 * 2)
    assert kw["MASK_MOD"] is call.mask.module.mod and (kw["SUB"], kw["KV_BLOCK"]) == (2, 128)
    assert kw["SCORE_MOD"] is None and kw["SCORE_GRAD"] is None
    score_caps, mask_caps = kw["mods"]
    assert score_caps == () and torch.equal(mask_caps[0], docs) and mask_caps[1:] == (n,)
    assert kw["blocks"][0] is bm.q_num_blocks and kw["blocks"][3] is bm.full_q_indices
    assert kw["blocks"][4:] == (*bm.transposed_strides(), bm.q_indices.shape[-1])
    assert dq.shape == q.shape and dk.shape == k.shape


def test_gluon_backward_launch_with_a_score_function(monkeypatch):
    """What the launch passes the Gluon backward for a score function whose captured table takes no
    gradient, beside a mask function: both functions and the score's gradient as compile-time arguments,
    the scores in the function's units (qk_scale log2 e), and at each call both functions' captures."""
    import ioattn.launch.gluon_bwd as gb
    from ioattn import backends
    from ioattn.kernels.constants import LOG2E
    from ioattn.modcall import ModCall
    from ioattn.plan import backward as backward_plan
    from ioattn.plan import mods as mods_plan
    from ioattn.semantics import Semantics

    names = [p.name for p in gb.hopper_bwd_ws_kernel.params]
    launches = fake_launches(monkeypatch, gb, "hopper_bwd_ws_kernel")
    n, d = 1000, 64
    q, out, dout = (torch.randn(2, n, 4, d).to(DEVICE, torch.bfloat16) for _ in range(3))
    k = torch.randn(2, n, 2, d).to(DEVICE, torch.bfloat16)
    lse = torch.randn(2, 4, n).to(DEVICE)
    table = torch.randn(4, 25).to(DEVICE)
    call = ModCall.make(M.relative_bias(table), M.causal_mask, None)
    assert call.grad_captures() == ()
    assert mods_plan.bwd_call_supported(q, k, k, False, Semantics(d ** -0.5), None, bool(call.grad_captures()),
                                        True)[0]
    sig = backends.backward_signature(q, k, d ** -0.5, False)
    plan = backward_plan.plan_backward_mods(sig, call.block_size(), score=True)
    launch = gb.BackwardLaunch(plan, dout, q, k, k, out, lse, cached=False, functions=call.backward_functions())
    launch(dout, q, k, k, out, lse, mod_args=call.gluon_backward_args())
    ((grid, head, kw),) = [x for x in launches if "SCORE_MOD" in x[2]]
    assert kw["SCORE_MOD"] is call.score.module.mod and kw["SCORE_GRAD"] is call.score.module.mod_grad
    assert kw["MASK_MOD"] is call.mask.module.mod and not kw["LSE_IN_ACC"]
    assert head[names.index("qk_scale")] == LOG2E and head[names.index("softmax_scale")] == d ** -0.5
    score_caps, mask_caps = kw["mods"]
    assert torch.equal(score_caps[0], table) and score_caps[1:] == (4, 25) and mask_caps == ()
    # the same table taking a gradient: the portable backward adds into it
    trained = ModCall.make(M.relative_bias(table.clone().requires_grad_()), M.causal_mask, None)
    ok, why = mods_plan.bwd_call_supported(q, k, k, False, Semantics(d ** -0.5), None,
                                           bool(trained.grad_captures()), True)
    assert not ok and "gradients" in why


def test_gluon_forward_launch_with_functions(monkeypatch):
    """What the launch passes the Gluon forward for a call with a score function and a block mask (a fake
    stands in for the kernel: no GPU here): the plan's tiles, SUB and Q_BLOCK, the generated functions as
    compile-time arguments, and at each call the scale, the captured tensors with their sizes and the
    block mask's lists."""
    import ioattn.kernels.hopper_forward as hf
    from ioattn import backends
    from ioattn.kernels.constants import LOG2E
    from ioattn.launch import gluon_fwd
    from ioattn.modcall import ModCall
    from ioattn.plan import forward as forward_plan

    names = [p.name for p in hf.hopper_fwd_kernel.params]
    launches = fake_launches(monkeypatch, hf, "hopper_fwd_kernel")
    n, d = 1000, 128
    q = torch.randn(2, n, 4, d).to(torch.bfloat16)
    k = torch.randn(2, n, 2, d).to(torch.bfloat16)
    tab = _table().requires_grad_(True)
    docs = torch.tensor([0] * 300 + [1] * 700, dtype=torch.int32)
    bm = create_block_mask(M.document_mask(docs, M.causal_mask), None, None, n, n, BLOCK_SIZE=128)
    call = ModCall.make(M.relative_bias(tab), None, bm)
    uncaptured = create_block_mask(M.causal_mask, None, None, n, n, BLOCK_SIZE=128)
    assert call.captures() and not ModCall.make(None, None, uncaptured).captures()
    plan = forward_plan.plan_forward_mods(backends.forward_signature(q, k, d ** -0.5, False), True,
                                          call.block_size(), call.captures())
    launch = gluon_fwd.ForwardLaunch(plan, q, k, k, cached=False, functions=call.functions())
    launch(q, k, k, mod_args=call.gluon_forward_args(d ** -0.5))
    ((grid, head, kw),) = launches
    kw.update(zip(names, head))  # the runtime arguments the fake keeps positionally
    assert grid == (plan.programs,) and plan.programs == 8 * 2 * 4
    assert kw["SCORE_MOD"] is call.score.module.mod and kw["MASK_MOD"] is call.mask.module.mod
    assert (kw["BLOCK_M"], kw["BLOCK_N"], kw["SUB"], kw["Q_BLOCK"]) == (128, 64, 2, 128)
    assert kw["qk_scale"] == LOG2E and kw["KV_TAIL"] and not kw["IS_CAUSAL"]
    scale, score_caps, mask_caps = kw["mods"]
    assert scale == d ** -0.5 and torch.equal(score_caps[0], tab.detach()) and score_caps[1:] == (H, 25)
    assert torch.equal(mask_caps[0], docs) and mask_caps[1:] == (n,)
    assert kw["blocks"][0] is bm.kv_num_blocks and kw["blocks"][3] is bm.full_kv_indices
