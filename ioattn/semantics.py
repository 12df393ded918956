"""What an attention call computes besides its tensors, as one value: built once from the validated
arguments (``ioattn.autograd``) and passed down to the routes and plans, which read the mask from it
instead of re-deriving it from the window. Shared by every layer, as ``ioattn.layout`` is."""
from __future__ import annotations

from dataclasses import dataclass

from ioattn.kernels.constants import LOG2E


@dataclass(frozen=True)
class Semantics:
    """``softmax_scale``: the scores' factor; ``window``: flash-attn's normalised (left, right), -1
    unbounded, bottom-right aligned, (-1, 0) the causal mask (``ioattn.masks.normalize_window``);
    ``softcap`` > 0: cap * tanh(s / cap); ``dropout_p``; ``alibi``: whether ALiBi slopes come with the
    call (the tensor travels beside this value). Hashable: part of the cached routes' keys."""
    softmax_scale: float
    window: tuple = (-1, -1)
    softcap: float = 0.0
    dropout_p: float = 0.0
    alibi: bool = False

    @property
    def causal(self) -> bool:
        """The causal mask (a window (left, 0) with left >= 0 is a sliding one)."""
        return self.window == (-1, 0)

    @property
    def sliding(self) -> bool:
        """A sliding window: some side bounded, and not the causal mask."""
        return self.window not in ((-1, -1), (-1, 0))

    @property
    def band_window(self) -> tuple:
        """The window as the Gluon plans take it beside ``causal``: (-1, -1) for the causal mask."""
        return (-1, -1) if self.causal else self.window

    @property
    def scale_log2(self) -> float:
        """The softmax scale in log2 units (the kernels' exponentials are exp2)."""
        return self.softmax_scale * LOG2E
