"""The programmable parts of one attention call (score function, mask function, block mask), checked
against the call and turned into the portable kernels' arguments."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ioattn import mods as _mods
from ioattn.block_mask import BlockMask


@dataclass(frozen=True, eq=False)
class ModCall:
    """``score`` / ``mask``: traced functions (``ioattn.mods.Mod``) or None; ``block_mask``: a
    ``BlockMask`` or None (its mask function is ``mask``)."""
    score: object = None
    mask: object = None
    block_mask: object = None

    @classmethod
    def make(cls, score_mod, mask_mod, block_mask):
        """None where the call has none of the three; raises on a bad function or block mask."""
        if score_mod is None and mask_mod is None and block_mask is None:
            return None
        if block_mask is not None and not isinstance(block_mask, BlockMask):
            raise TypeError(f"block_mask must be an ioattn.BlockMask (ioattn.create_block_mask), got "
                            f"{type(block_mask).__name__}")
        score = None if score_mod is None else _mods.trace(score_mod, "score")
        mask = None if mask_mod is None else _mods.trace(mask_mod, "mask")
        if block_mask is not None and block_mask.mask_mod is not None:
            if mask is not None and mask.fn is not block_mask.mask_mod.fn and mask is not block_mask.mask_mod:
                raise ValueError("mask_mod and block_mask's mask function differ: pass the block mask alone (it "
                                 "carries its mask function), or build it from this mask_mod")
            mask = block_mask.mask_mod
        elif block_mask is not None and mask is not None:
            raise ValueError("a block-sparse layout (ioattn.block_sparse_mask) takes no mask_mod: build the block "
                             "mask with ioattn.create_block_mask(mask_mod, ...) instead")
        return cls(score, mask, block_mask)

    def check(self, batch, nheads, seqlen_q, seqlen_k, device):
        for m in (self.score, self.mask):
            if m is not None:
                m.check_device(device)
        if self.block_mask is not None:
            self.block_mask.check_call(batch, nheads, seqlen_q, seqlen_k, device)

    @property
    def key(self):
        """What the kernels compile for this call (the generated modules and the block sizes)."""
        bm = self.block_mask
        return (self.score.key if self.score else None, self.mask.key if self.mask else None,
                bm.block_size if bm is not None else None)

    def builtin(self, seqlen_q, seqlen_k, varlen):
        """The call as flash-attn's built-in arguments, where its functions are library ones with such a
        form (``ioattn.mods``' ``builtin`` attributes): {"window", "softcap", "alibi_slopes"} in the
        built-in conventions (bottom-right), or None. A block mask goes with it only when built from the
        same mask function (it then skips what the built-in ranges skip)."""
        if varlen:  # the built-in forms align each sequence bottom-right; the functions' offsets are fixed
            return None
        out = dict(window=(-1, -1), softcap=0.0, alibi_slopes=None)
        mask, score, bm = self.mask, self.score, self.block_mask
        if bm is not None and (bm.mask_mod is None or bm.mask_mod is not mask):
            return None
        if mask is not None:
            form = getattr(mask.fn, "builtin", None)
            if form is None or form[3] != seqlen_k - seqlen_q:
                return None
            out["window"] = (form[1], form[2])
        if score is not None:
            form = getattr(score.fn, "builtin", None)
            if form is None:
                return None
            if form[0] == "softcap":
                out["softcap"] = form[1]
            elif form[2] == seqlen_k - seqlen_q and not form[1].requires_grad:
                out["alibi_slopes"] = form[1]
            else:
                return None
        return out

    def grad_captures(self):
        """The captured tensors that get gradients (the score function's), in ``score.grad_captures``'s order."""
        if self.score is None:
            return ()
        return tuple(self.score.captures[i] for i in self.score.grad_captures)

    def fit_tiles(self, cfg):
        """``cfg`` (a ``TileConfig``) with tiles that divide the block mask's blocks."""
        if self.block_mask is None:
            return cfg
        bq, bk = self.block_mask.block_size
        return dataclasses.replace(cfg, block_m=min(cfg.block_m, bq), block_n=min(cfg.block_n, bk))

    def forward_kwargs(self, softmax_scale, cfg):
        """The portable forward's (and dQ pass's) mod arguments for tiles ``cfg``."""
        kw = dict(mods=(float(softmax_scale), self._caps(self.score), self._caps(self.mask)),
                  SCORE_MOD=self.score.module.mod if self.score else None,
                  MASK_MOD=self.mask.module.mod if self.mask else None)
        bm = self.block_mask
        if bm is not None:
            sb, sh = bm.strides()
            kw.update(blocks=(bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, sb, sh,
                              bm.kv_indices.shape[-1]),
                      SUB=bm.block_size[1] // cfg.block_n, Q_BLOCK=bm.block_size[0])
        return kw

    def block_size(self):
        """The block mask's (query, key) block, or None."""
        return None if self.block_mask is None else tuple(self.block_mask.block_size)

    def captures(self):
        """Whether a function captures a tensor (the Gluon forward's tiles: ``plan.mods.tiles``)."""
        return bool(self._caps(self.score) or self._caps(self.mask))

    def functions(self):
        """The kernels' compile-time functions: {"SCORE_MOD": ..., "MASK_MOD": ...} (None where absent)."""
        return dict(SCORE_MOD=self.score.module.mod if self.score else None,
                    MASK_MOD=self.mask.module.mod if self.mask else None)

    def exact_lists(self):
        """Whether the block mask (if any) comes from a mask function, which masks its partial blocks: its
        lists can then be regrouped into other query blocks (``BlockMask.regrouped``)."""
        return self.block_mask is None or self.block_mask.mask_mod is not None

    def gluon_forward_args(self, softmax_scale, q_block=0):
        """The Gluon forward's run-time mod arguments: (mods, blocks) (``hopper_fwd_kernel``'s), the block
        mask's lists for query blocks of ``q_block`` rows (the plan's ``Q_BLOCK``; 0: its own)."""
        bm = self.block_mask
        blocks = None
        if bm is not None:
            if q_block and q_block != bm.block_size[0]:
                bm = bm.regrouped(q_block)
            blocks = (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, *bm.strides(),
                      bm.kv_indices.shape[-1])
        return (float(softmax_scale), self._caps(self.score), self._caps(self.mask)), blocks

    def backward_functions(self):
        """The Gluon backward's compile-time functions: ``functions`` and the score function's gradient
        ({"SCORE_GRAD": ...}, None where absent)."""
        return dict(self.functions(), SCORE_GRAD=self.score.module.mod_grad if self.score else None)

    def gluon_backward_args(self):
        """The Gluon backward's run-time mod arguments: ((the score function's captures, the mask
        function's), the block mask's transposed lists or None) (``hopper_bwd_ws_kernel``'s ``mods`` /
        ``blocks``)."""
        bm = self.block_mask
        blocks = None
        if bm is not None:
            blocks = (bm.q_num_blocks, bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices,
                      *bm.transposed_strides(), bm.q_indices.shape[-1])
        return (self._caps(self.score), self._caps(self.mask)), blocks

    def heads_share_lists(self):
        """Whether the block mask's lists are one for every head (or there is no block mask)."""
        return self.block_mask is None or self.block_mask.q_num_blocks.shape[1] == 1

    def backward_kwargs(self, softmax_scale, cfg, grads):
        """The portable backward's mod arguments for tiles ``cfg``: (dK / dV pass's, dQ pass's);
        ``grads``: fp32 buffers for the captured tensors' gradients (``empty_grads``)."""
        score = self.score
        base = dict(mods=(float(softmax_scale), self._caps(score), self._caps(self.mask), tuple(grads)),
                    SCORE_MOD=score.module.mod if score else None,
                    SCORE_GRAD=score.module.mod_grad if score else None,
                    MASK_MOD=self.mask.module.mod if self.mask else None)
        dkdv, dq = dict(base), dict(base)
        bm = self.block_mask
        if bm is not None:
            bq, bk = bm.block_size
            sb, sh = bm.transposed_strides()
            dkdv.update(blocks=(bm.q_num_blocks, bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices, sb, sh,
                                bm.q_indices.shape[-1]), SUB=bq // cfg.block_m, KV_BLOCK=bk)
            sb, sh = bm.strides()
            dq.update(blocks=(bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, sb, sh,
                              bm.kv_indices.shape[-1]), SUB=bk // cfg.block_n, Q_BLOCK=bq)
        return dkdv, dq

    @staticmethod
    def _caps(mod):
        return () if mod is None else mod.kernel_captures()


def empty_grads(call, device):
    """fp32 zero buffers for the captured tensors' gradients (the kernels add into them)."""
    return tuple(torch.zeros(c.shape, dtype=torch.float32, device=device) for c in call.grad_captures())
