"""Page 1: the memory wall, from the IO model (``ioattn.reference.io_model``).

For one head in bf16 on an H100, over the sequence lengths and head dims of the sliders: the HBM
bytes of standard attention's forward (S and P written and read back) against the tiled algorithms'
(FlashAttention-1's and -2's loop orders, every re-read counted) and the compulsory minimum (each
input read once, the output written once), their arithmetic intensity against the device's balance,
and the time bound that follows. Every figure is ``io_model.predict``'s, and beside them, where the
committed measurement has the point (``data/io-measured.jsonl``: ``ioattn io --measure --out``'s
records, from an H100), the DRAM bytes ioattn's kernels and PyTorch's math attention actually moved.
"""
from __future__ import annotations

import json
from importlib import resources

from ioattn.explainers.numbers import name
from ioattn.reference import io_model

SEQLENS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
HEAD_DIMS = (64, 128, 256)
DEVICE, DTYPE = "h100", "bf16"
ALGORITHMS = ("standard", "fa1", "fa2", "minimum")
MEASURED = "io-measured.jsonl"


def point(seqlen: int, headdim: int) -> dict:
    """The forward's figures of each algorithm at one (N, d), one head."""
    pred = io_model.predict(io_model.Problem(seqlen, headdim, dtype=DTYPE), DEVICE)
    rows = {x.algorithm: pred.figures(x) for x in pred.passes if x.direction == "forward"}
    std = rows["standard"]["terms"]
    sp = sum(std[t]["read"] + std[t]["written"] for t in std if t in ("S", "P"))
    return dict(n=seqlen, d=headdim, sp_bytes=sp, other_std_bytes=rows["standard"]["bytes"] - sp,
                **{a: {k: rows[a][k] for k in ("bytes", "flops", "intensity", "time_s", "bound", "vs_standard")}
                   for a in ALGORITHMS})


def measured(text: str | None = None) -> list:
    """The committed measurements of one head's forward in bf16 (or ``text``, records as ``ioattn io
    --measure --out`` writes them): per (N, d), the bytes ioattn's kernels (``fa2``) and PyTorch's math
    attention (``standard``) moved; the page sets them beside the model's counts."""
    if text is None:
        text = resources.files("ioattn.explainers").joinpath("data", MEASURED).read_text(encoding="utf-8")
    out = []
    for line in text.splitlines():
        rec = json.loads(line)
        p = rec["problem"]
        if p["batch"] * p["nheads"] != 1 or p["dtype"] != DTYPE or p["causal"]:
            continue
        rows = {(r["pass"], r["algorithm"]): r for r in rec["rows"]}
        fa2, std = rows[("forward", "fa2")], rows[("forward", "standard")]  # measured beside these rows
        if "measured" not in fa2:
            continue
        out.append(dict(n=p["seqlen_q"], d=p["headdim"], command=rec["command"], fa2=fa2["measured"]["bytes"],
                        standard=std["measured"]["bytes"]))
    return sorted(out, key=lambda m: (m["d"], m["n"]))


def data() -> dict:
    """Page 1's numbers: every (N, d) point of the sliders and the device's figures."""
    dev = io_model.DEVICES[DEVICE]
    points = [point(n, d) for d in HEAD_DIMS for n in SEQLENS]
    return dict(
        source=(f"computed at build time by {name(io_model.predict)} (one head, {DTYPE}, the {dev.name} preset: "
                f"{dev.source}); every load and store counted as an HBM access"),
        seqlens=list(SEQLENS), head_dims=list(HEAD_DIMS), algorithms=list(ALGORITHMS), points=points,
        device=dict(name=dev.name, bandwidth=dev.bandwidth, peak=dev.peak[DTYPE], sram=dev.sram, l2=dev.l2,
                    balance=dev.peak[DTYPE] / dev.bandwidth),
        default=dict(n=16384, d=128), measured=measured(),
        measured_source="DRAM bytes measured on an H100 by Nsight Compute (ioattn io --measure), "
                        "one call after a warm-up")
