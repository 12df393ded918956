"""Interactive explainer pages of FlashAttention, built from the library's own numbers.

Each page is a module here with ``data() -> dict`` (its numbers, computed when the page is built by
``ioattn.reference`` and the public functions, from fixed seeds) and an HTML template of the same
name (``online_softmax.py`` and ``online_softmax.html``: the page's ``<main>`` and script).
``ioattn.explainers.site`` puts the template into the shared document (``shell.html``) and embeds the
data as JSON, with the shared stylesheet and script, into one self-contained file: its
script reads only that JSON, and nothing is fetched from the network. ``ioattn explain --out DIR``
writes every page and an index.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    """One numbered place in the index: its file name stem, title and summary, and the module that
    builds it."""
    number: int
    slug: str
    title: str
    summary: str
    module: str

    @property
    def filename(self) -> str:
        return f"{self.number}-{self.slug}.html"


SLOTS = (
    Slot(1, "memory-wall", "The memory wall, from an IO model",
         "Why standard attention is bound by memory traffic, not arithmetic.", "memory_wall"),
    Slot(2, "online-softmax", "Online softmax on a 4×6 score matrix",
         "The running max, sum and unnormalised output, block by block, and the exact result.",
         "online_softmax"),
    Slot(3, "recomputation", "Recomputation in the backward",
         "The forward keeps O and the log-sum-exp; the backward rebuilds P block by block.",
         "recomputation"),
    Slot(4, "work-partitioning", "FlashAttention-2's work partitioning",
         "Which warps and programs own which rows and columns.", "work_partitioning"),
    Slot(5, "ping-pong", "FlashAttention-3's ping-pong timeline",
         "Two warpgroups taking turns between the tensor cores and the softmax.", "pingpong"),
    Slot(6, "flash-decoding", "Flash-Decoding",
         "One query token, a long KV cache split across programs, and the exact merge by LSE.",
         "flash_decoding"),
    Slot(7, "unified-max", "FlashDecoding++'s unified max",
         "A fixed φ instead of each split's running max, its safe range, and what happens outside it.",
         "unified_max"),
    Slot(8, "fp8-rotation", "FP8 outliers and the random Hadamard rotation",
         "Outlier channels, the rotation that spreads them, and FP8 attention's error with and without it.",
         "fp8_rotation"),
)
