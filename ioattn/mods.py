"""Programmable attention: mask and score functions written as ordinary Python over tensors.

``mask_mod(b, h, q_idx, kv_idx) -> bool`` keeps a (query, key) pair; ``score_mod(score, b, h, q_idx,
kv_idx) -> score`` rewrites a scaled score (``softmax_scale * q . k``) before the mask and the
softmax. ``b`` is the batch entry (the sequence, for the varlen functions), ``h`` the query head,
``q_idx`` / ``kv_idx`` the positions in that sequence. The functions are called with broadcast
integer tensors (``b``, ``h``: (1, 1); ``q_idx``: (M, 1); ``kv_idx``: (1, N); the score: (M, N)), so
they must use tensor operations, not Python branches on values. Tensors they capture (a bias
table, document ids) are read by indexing, ``table[h, q_idx - kv_idx]``, one index per dimension;
a captured floating-point tensor that requires grad gets its gradient.

``trace(fn, kind)`` turns a function into a ``Mod``: its aten graph (``torch.fx``), the tensors it
captures, and the Triton source that the kernels call per tile (``ioattn.kernels.modgen``); a score
function's ``Mod`` carries its gradient's graph too. Traced once per function and captured tensors'
identities and shapes.

The library: ``causal_mask`` (top-left: FlexAttention's), ``bottom_right_causal`` (flash-attn's
alignment), ``sliding_window``, ``prefix_lm``, ``document_mask`` (with ``document_ids`` from
``cu_seqlens``), ``alibi``, ``softcap``, ``relative_bias``; ``and_masks`` / ``or_masks`` compose masks.
"""
from __future__ import annotations

import dataclasses
import functools
import types
from dataclasses import dataclass, field

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ioattn.kernels import modgen
from ioattn.reference.naive import mod_index

__all__ = ["causal_mask", "bottom_right_causal", "sliding_window", "prefix_lm", "document_mask", "document_ids",
           "alibi", "softcap", "relative_bias", "and_masks", "or_masks", "trace", "Mod", "dense_mask",
           "dense_scores"]

_M, _N = 2, 3  # the traced tile: distinct sizes, so each value's axes are known from its shape


# ---- the library ----

def causal_mask(b, h, q_idx, kv_idx):
    """Query i sees keys 0..i (top-left aligned, FlexAttention's causal mask)."""
    return q_idx >= kv_idx


# The built-in form of a library function (``ModCall.builtin``): a mask's band ("band", left, right,
# offset): keys in [q_idx + offset - left, q_idx + offset + right], -1 unbounded; a score function's
# ("softcap", cap) or ("alibi", slopes, offset).
causal_mask.builtin = ("band", -1, 0, 0)


def _per_batch(x):
    """An int, or a per-batch tensor read at b."""
    if isinstance(x, torch.Tensor):
        if x.dim() != 1:
            raise ValueError(f"a per-sequence length must be an int or a 1-D tensor, got shape {tuple(x.shape)}")
        return lambda b: x[b]
    return lambda b: int(x)


def bottom_right_causal(seqlen_q, seqlen_k):
    """flash-attn's causal mask: query i sits at key position i + seqlen_k - seqlen_q. The lengths:
    ints, or 1-D tensors of one length per sequence (indexed by ``b``; the varlen functions)."""
    lq, lk = _per_batch(seqlen_q), _per_batch(seqlen_k)

    def bottom_right_causal_mask(b, h, q_idx, kv_idx):
        return q_idx + (lk(b) - lq(b)) >= kv_idx
    if not isinstance(seqlen_q, torch.Tensor) and not isinstance(seqlen_k, torch.Tensor):
        bottom_right_causal_mask.builtin = ("band", -1, 0, int(seqlen_k) - int(seqlen_q))
    return bottom_right_causal_mask


def sliding_window(left, right=0, offset=0):
    """Keys within ``left`` before and ``right`` after the query's position plus ``offset``
    (``offset = seqlen_k - seqlen_q`` aligns it bottom-right, as ``window_size``); -1: unbounded."""
    if left < -1 or right < -1:
        raise ValueError(f"sliding_window's left and right must be >= -1, got ({left}, {right})")

    def sliding_window_mask(b, h, q_idx, kv_idx):
        rel = q_idx + offset - kv_idx
        keep = rel == rel
        if left >= 0:
            keep = keep & (rel <= left)
        if right >= 0:
            keep = keep & (rel >= -right)
        return keep
    sliding_window_mask.builtin = ("band", int(left), int(right), int(offset))
    return sliding_window_mask


def prefix_lm(prefix_len):
    """Every query sees the first ``prefix_len`` keys (an int, or one per sequence as a 1-D tensor)
    and, after them, the keys up to its own position (top-left causal)."""
    prefix = _per_batch(prefix_len)

    def prefix_lm_mask(b, h, q_idx, kv_idx):
        return (kv_idx < prefix(b)) | (q_idx >= kv_idx)
    return prefix_lm_mask


def document_ids(cu_seqlens, total=None):
    """The document index of each packed token from cumulative lengths (batch + 1,): (total,) int32."""
    total = int(cu_seqlens[-1]) if total is None else total
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return torch.repeat_interleave(torch.arange(len(lengths), device=cu_seqlens.device, dtype=torch.int32),
                                   lengths, output_size=total)


def document_mask(doc_ids, inner=None):
    """Tokens attend only within their document: ``doc_ids`` (seqlen,) or (batch, seqlen) of packed
    sequences (``document_ids``); ``inner``, a mask_mod on positions within the document
    (e.g. ``causal_mask``), applied on top with the positions the packed sequence gives."""
    if doc_ids.dim() not in (1, 2):
        raise ValueError(f"doc_ids must be (seqlen,) or (batch, seqlen), got shape {tuple(doc_ids.shape)}")
    ids = (lambda b, i: doc_ids[i]) if doc_ids.dim() == 1 else (lambda b, i: doc_ids[b, i])

    def document_mask_mod(b, h, q_idx, kv_idx):
        same = ids(b, q_idx) == ids(b, kv_idx)
        return same if inner is None else same & inner(b, h, q_idx, kv_idx)
    return document_mask_mod


def alibi(slopes, offset=0):
    """ALiBi as a score function: ``- slopes[h] * |q_idx + offset - kv_idx|`` (``offset = seqlen_k -
    seqlen_q``: the built-in ``alibi_slopes``'s bottom-right rule); ``slopes`` (nheads,) or (batch,
    nheads), ``offset`` an int or one per sequence (a 1-D tensor, the varlen functions)."""
    if slopes.dim() not in (1, 2):
        raise ValueError(f"alibi's slopes must be (nheads,) or (batch, nheads), got shape {tuple(slopes.shape)}")
    slope = (lambda b, h: slopes[h]) if slopes.dim() == 1 else (lambda b, h: slopes[b, h])
    off = _per_batch(offset)

    def alibi_mod(score, b, h, q_idx, kv_idx):
        return score - slope(b, h) * (q_idx + off(b) - kv_idx).abs()
    if slopes.dim() == 1 and not isinstance(offset, torch.Tensor):
        alibi_mod.builtin = ("alibi", slopes, int(offset))
    return alibi_mod


def softcap(cap):
    """``cap * tanh(score / cap)`` (Gemma 2, Grok)."""
    if not cap > 0:
        raise ValueError(f"softcap's cap must be > 0, got {cap}")

    def softcap_mod(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / cap) * cap
    softcap_mod.builtin = ("softcap", float(cap))
    return softcap_mod


def relative_bias(table, max_distance=None):
    """A learnable bias per head and relative position: ``score + table[h, clamp(q_idx - kv_idx,
    -max_distance, max_distance) + max_distance]``; ``table`` (nheads, 2 * max_distance + 1)."""
    if table.dim() != 2 or table.shape[1] % 2 != 1:
        raise ValueError(f"relative_bias's table must be (nheads, 2 * max_distance + 1), got {tuple(table.shape)}")
    reach = table.shape[1] // 2 if max_distance is None else max_distance
    if table.shape[1] != 2 * reach + 1:
        raise ValueError(f"relative_bias's table has {table.shape[1]} columns, max_distance {reach} needs "
                         f"{2 * reach + 1}")

    def relative_bias_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, (q_idx - kv_idx).clamp(-reach, reach) + reach]
    return relative_bias_mod


def and_masks(*masks):
    """A mask_mod keeping the pairs every one of ``masks`` keeps."""
    return _combined("and_masks", masks, lambda a, b: a & b)


def or_masks(*masks):
    """A mask_mod keeping the pairs any one of ``masks`` keeps."""
    return _combined("or_masks", masks, lambda a, b: a | b)


def _combined(name, masks, op):
    if not masks:
        raise ValueError(f"{name} needs at least one mask_mod")

    def combined_mask(b, h, q_idx, kv_idx):
        keep = masks[0](b, h, q_idx, kv_idx)
        for m in masks[1:]:
            keep = op(keep, m(b, h, q_idx, kv_idx))
        return keep
    combined_mask.__name__ = name.replace("_masks", "_mask")
    return combined_mask


# ---- tracing ----

@dataclass(eq=False)
class Mod:
    """A traced mask or score function. ``captures``: the tensors it reads, in the order the
    kernels take them (contiguous copies travel at call time, ``kernel_captures``); ``module``: the
    generated Triton module (``mod`` and, for a score function, ``mod_grad``); ``grad_captures``: the
    indices of the captures that get a gradient."""
    kind: str
    name: str
    fn: object
    graph: torch.fx.GraphModule
    captures: tuple
    grad_captures: tuple = ()
    grad_graph: object = None
    _module: object = field(default=None, repr=False)

    @property
    def module(self):
        if self._module is None:
            shapes = [tuple(c.shape) for c in self.captures]
            self._module = modgen.load(modgen.write_source(self.kind, self.graph, shapes, self.grad_graph,
                                                           self.grad_captures))
        return self._module

    @property
    def key(self):
        """Hashable identity of what the kernels compile: the generated source's module name."""
        return self.module.__name__

    def kernel_captures(self):
        return modgen.kernel_arguments(self.captures)

    def check_device(self, device):
        for c in self.captures:
            if c.device != device:
                raise ValueError(f"{self.name} captures a tensor of shape {tuple(c.shape)} on {c.device}; the "
                                 f"call's tensors are on {device}: move it there")

    def __call__(self, *args):
        return self.fn(*args)


def _index_args(device="cpu"):
    i32 = torch.int32
    return (torch.zeros(1, 1, dtype=i32, device=device), torch.zeros(1, 1, dtype=i32, device=device),
            torch.arange(_M, dtype=i32, device=device).view(_M, 1),
            torch.arange(_N, dtype=i32, device=device).view(1, _N))


def _fingerprint(fn, found, depth=0):
    """What a traced function depends on besides its code: the values its closure and globals hold
    (simple values by value; tensors by shape, dtype, device and whether they require grad, except
    one-element tensors, by identity: the trace may have made one a literal). The tensors met are
    appended to ``found`` in the walk's order, the same for every function of the same key."""
    if depth > 8:
        return (id(fn),)
    parts = [getattr(fn, "__code__", None) or id(fn)]
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]
    glob = getattr(fn, "__globals__", {})
    names = getattr(getattr(fn, "__code__", None), "co_names", ())
    for v in cells + [glob[n] for n in names if n in glob]:
        parts.append(_value_key(v, found, depth))
    return tuple(parts)


def _filled(cell):
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


def _value_key(v, found, depth):
    if isinstance(v, torch.Tensor):
        found.append(v)
        return ("t", id(v) if v.numel() == 1 else None, tuple(v.shape), v.dtype, v.device, v.requires_grad)
    if isinstance(v, (int, float, bool, str, type(None))):
        return ("v", type(v).__name__, v)
    if isinstance(v, (types.FunctionType, functools.partial)):
        return ("f", _fingerprint(v.func if isinstance(v, functools.partial) else v, found, depth + 1))
    if isinstance(v, (tuple, list)):
        return ("s", tuple(_value_key(x, found, depth + 1) for x in v))
    return ("o", id(v))


# traces by function and captured tensors' shapes: (the Mod, where its captures sit among the tensors the
# fingerprint walk meets, or None where one is not among them). A graph holds no captured value (tracing
# refuses reads on the host, and one-element tensors, which may become literals, are keyed by identity).
# Each entry holds its function and tensors, so the cache is bounded (cleared when full).
_TRACED: dict = {}
_TRACED_LIMIT = 64


def trace(fn, kind):
    """The ``Mod`` of a mask (``kind="mask"``) or score (``"score"``) function, validated: a mask
    returns booleans, a score function a float32 tile of the score's shape. Raises ``TypeError`` /
    ``ValueError`` naming the function otherwise. A function rebuilt around new tensors of the same
    shapes (a document mask over the next batch's ids) reuses the trace and its kernels."""
    if isinstance(fn, Mod):
        if fn.kind != kind:
            raise TypeError(f"{fn.name} is a traced {fn.kind} function, given as a {kind} function")
        return fn
    what = "mask_mod" if kind == "mask" else "score_mod"
    if not callable(fn):
        raise TypeError(f"{what} must be a function, got {type(fn).__name__}")
    found = []
    key = (kind, _fingerprint(fn, found))
    hit = _TRACED.get(key)
    if hit is not None and hit[1] is None:  # a capture out of the walk's sight: only its own tensors
        hit = _TRACED.get(key + tuple(id(t) for t in found))
    if hit is not None:
        mod, where = hit
        if where is None or all(found[i] is c for i, c in zip(where, mod.captures)):
            return mod
        return dataclasses.replace(mod, fn=fn, captures=tuple(found[i] for i in where))
    mod = _trace(fn, kind, what, next((t.device for t in found if t.device.type != "cpu"), "cpu"))
    where = _positions(mod, found)
    if len(_TRACED) >= _TRACED_LIMIT:
        _TRACED.clear()
    _TRACED[key] = (mod, where)
    if where is None:
        _TRACED[key + tuple(id(t) for t in found)] = (mod, where)
    return mod


def _positions(mod, found):
    """Where each of ``mod``'s captures sits in ``found``; None where one is not there (reached through
    an object's attribute, say)."""
    where = []
    for c in mod.captures:
        i = next((i for i, t in enumerate(found) if t is c), None)
        if i is None:
            return None
        where.append(i)
    return tuple(where)


def _trace(fn, kind, what, device="cpu"):
    """``trace``'s work, over index tensors on ``device`` (where the function's captured tensors are)."""
    name = f"{what} {getattr(fn, '__name__', type(fn).__name__)}"
    idx = _index_args(device)
    score = torch.zeros(_M, _N, dtype=torch.float32, device=device)
    args = idx if kind == "mask" else (score, *idx)
    try:
        gm = make_fx(fn, tracing_mode="real")(*args)
    except Exception as e:  # the user's function failed on tensors: say so, with its error
        raise ValueError(f"{name} could not be traced over tensors (b, h: (1, 1); q_idx: ({_M}, 1); kv_idx: "
                         f"(1, {_N}){'; score: float32' if kind == 'score' else ''}): {type(e).__name__}: {e}. "
                         f"Write it with tensor operations (no Python branches on values).") from e
    out = _output_meta(gm)
    if kind == "mask" and (out is None or out.dtype != torch.bool):
        raise TypeError(f"{name} must return booleans, got {_describe(out)}")
    if kind == "mask" and not _broadcasts(tuple(out.shape), (_M, _N)):
        raise ValueError(f"{name} must return a value broadcasting to the (query, key) tile, got shape "
                         f"{tuple(out.shape)}")
    if kind == "score" and (out is None or out.dtype != torch.float32 or tuple(out.shape) != (_M, _N)):
        raise TypeError(f"{name} must return a score of the score's shape and dtype (({_M}, {_N}) float32 "
                        f"when traced), got {_describe(out)}")
    gm, captures = _lift_captures(gm, len(args))
    mod = Mod(kind, name, fn, gm, captures)
    if kind == "score":
        grad_idx = tuple(i for i, c in enumerate(captures) if c.is_floating_point() and c.requires_grad)
        mod.grad_captures = grad_idx
        mod.grad_graph = _trace_grad(gm, captures, grad_idx, (score, *idx), name)
    try:
        mod.module  # write the kernel source now: an unsupported operation is refused here
    except modgen.UnsupportedMod as e:
        raise ValueError(f"{name}: {e}") from None
    return mod


def _describe(out):
    return "nothing" if out is None else f"{out.dtype} of shape {tuple(out.shape)}"


def _broadcasts(shape, to):
    return len(shape) <= len(to) and all(s in (1, t) for s, t in zip(reversed(shape), reversed(to)))


def _output_meta(gm):
    node = next(n for n in gm.graph.nodes if n.op == "output")
    out = node.args[0]
    if isinstance(out, (tuple, list)):
        return None
    val = out.meta.get("val") if isinstance(out, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _lift_captures(gm, n_args):
    """Replace the graph's captured tensors (``get_attr`` constants) by placeholders after the
    arguments; tiny constants the function made itself become literals."""
    graph = gm.graph
    holders = [n for n in graph.nodes if n.op == "placeholder"]
    captures, lifted = [], {}
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        t = getattr(gm, node.target)
        if not isinstance(t, torch.Tensor):
            continue
        if t.numel() == 1 and not t.requires_grad and all(u.target is not torch.ops.aten.index.Tensor
                                                           or u.args[0] is not node for u in node.users):
            with graph.inserting_before(node):
                lit = graph.call_function(torch.ops.aten.scalar_tensor.default, (t.item(),))
                lit.meta["val"] = t
            node.replace_all_uses_with(lit)
            graph.erase_node(node)
            continue
        key = id(t)
        if key not in lifted:
            with graph.inserting_after(holders[-1] if not captures else lifted[id(captures[-1])]):
                ph = graph.placeholder(f"capture_{len(captures)}")
                ph.meta["val"] = t
            lifted[key] = ph
            captures.append(t)
        node.replace_all_uses_with(lifted[key])
        graph.erase_node(node)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return gm, tuple(captures)


def _trace_grad(gm, captures, grad_idx, args, name):
    """The vector-Jacobian product of a score function: (score, b, h, q_idx, kv_idx, *captures,
    grad) -> (d_score, d_capture for each of ``grad_idx``)."""
    def vjp(score, b, h, q_idx, kv_idx, *rest):
        caps, grad = list(rest[:-1]), rest[-1]
        with torch.enable_grad():
            score = score.detach().requires_grad_(True)
            for i in grad_idx:
                caps[i] = caps[i].detach().requires_grad_(True)
            out = gm(score, b, h, q_idx, kv_idx, *caps)
            wrt = [score] + [caps[i] for i in grad_idx]
            return tuple(torch.autograd.grad(out, wrt, grad, allow_unused=True))

    plain = [c.detach() for c in captures]
    try:
        g = make_fx(vjp, tracing_mode="real")(*args, *plain, torch.ones(_M, _N, device=args[0].device))
    except Exception as e:
        raise ValueError(f"{name}: its gradient could not be traced: {type(e).__name__}: {e}") from e
    g.graph.eliminate_dead_code()
    g.recompile()
    return g


# ---- applied densely (the references and the CPU path) ----

def dense_mask(mask_mod, batch, nheads, seqlen_q, seqlen_k, device="cpu", b_offset=0):
    """The mask as a bool tensor (batch, nheads, seqlen_q, seqlen_k); ``b_offset``: the first batch
    entry's index (one sequence of a varlen call at a time)."""
    keep = mask_mod(*mod_index(batch, nheads, seqlen_q, seqlen_k, device, b_offset))
    return keep.expand(batch, nheads, seqlen_q, seqlen_k)


def dense_scores(score_mod, scores, b_offset=0):
    """``score_mod`` applied to scores (batch, nheads, seqlen_q, seqlen_k), differentiably."""
    return score_mod(scores, *mod_index(*scores.shape, scores.device, b_offset))
