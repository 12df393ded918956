"""Small helpers the pages share: fixed-seed inputs and tensors as JSON-ready lists."""
from __future__ import annotations

import math

import torch

F64 = torch.float64


def randn(seed: int, *shapes) -> list:
    """One float64 N(0, 1) tensor per shape, drawn in order from a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, dtype=F64, generator=g) for shape in shapes]


def plain(x):
    """A tensor (or a number) as nested lists of Python floats; -inf becomes None (JSON has no
    infinities). Any other non-finite value is an error: the pages show no NaN."""
    if isinstance(x, torch.Tensor):
        x = x.tolist()
    if isinstance(x, list):
        return [plain(v) for v in x]
    x = float(x)
    if x == -math.inf:
        return None
    if not math.isfinite(x):
        raise ValueError(f"a page's numbers must be finite (or -inf), got {x}")
    return x


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference of two tensors of the same shape, as a float."""
    return (a.to(F64) - b.to(F64)).abs().max().item()


def name(fn) -> str:
    """``module.function`` of a library function, for the pages' statements of where numbers come from."""
    return f"{fn.__module__}.{fn.__qualname__}"
