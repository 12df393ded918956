"""Page 5: FlashAttention-3's ping-pong, as ioattn's Hopper forward records it.

The two consumer warpgroups of the one-tile ping-pong kernel take turns at the tensor cores: in its
critical section a warpgroup issues S(j) = Q K(j)^T and P(j-1) V(j-1), passes the turn, and runs the
softmax of S(j) while its P V and the other warpgroup's GEMMs run. ``ioattn bench pingpong-trace``
launches that kernel with its schedule record (each warpgroup's clock when it takes its turn, when S
is ready, when its softmax and its P V are done) on an sm_90 GPU; the record, committed as
``data/pingpong-trace.json``, is this page's data. ``data`` turns it into intervals per warpgroup and
measures how much of each warpgroup's softmax ran while the other had a GEMM in flight.
"""
from __future__ import annotations

import json
from importlib import resources

TRACE = "pingpong-trace.json"


def load(text: str | None = None) -> dict:
    """The committed record (or ``text``, a record as ``ioattn bench pingpong-trace --out`` writes it)."""
    if text is None:
        text = resources.files("ioattn.explainers").joinpath("data", TRACE).read_text(encoding="utf-8")
    return json.loads(text)


def intervals(wg: list) -> dict:
    """One warpgroup's sections ([turn, s_ready, softmax_done, pv_done], cycles or None) as intervals:
    ``s`` S(j)'s product (turn j to S(j) ready), ``softmax`` (S(j) ready to its softmax done), ``pv``
    P(j-1) V(j-1) (issued at turn j, done at pv_done of section j)."""
    out = {"s": [], "softmax": [], "pv": []}
    for j, (turn, s_ready, soft_done, pv_done) in enumerate(wg):
        if turn is not None and s_ready is not None:
            out["s"].append([turn, s_ready])
        if s_ready is not None and soft_done is not None:
            out["softmax"].append([s_ready, soft_done])
        if j > 0 and turn is not None and pv_done is not None:
            out["pv"].append([turn, pv_done])
    return out


def _covered(span, busy) -> int:
    """Cycles of ``span`` inside the union of the ``busy`` intervals."""
    lo, hi = span
    total, cur = 0, lo
    for a, b in sorted(busy):
        a, b = max(a, cur), min(b, hi)
        if b > a:
            total += b - a
            cur = b
    return total


def overlap(lanes: list) -> list:
    """Per warpgroup: the share of its softmax cycles during which another warpgroup had a GEMM (S or
    P V) in flight: the ping-pong's claim, measured."""
    shares = []
    for w, lane in enumerate(lanes):
        others = [iv for v, o in enumerate(lanes) if v != w for iv in o["s"] + o["pv"]]
        soft = sum(b - a for a, b in lane["softmax"])
        shares.append(sum(_covered(iv, others) for iv in lane["softmax"]) / soft if soft else 0.0)
    return shares


def data(record: dict | None = None) -> dict:
    rec = load() if record is None else record
    ctas = []
    for cta in rec["ctas"]:
        lanes = [intervals(wg) for wg in cta]
        end = max(b for lane in lanes for ivs in lane.values() for _, b in ivs)
        ctas.append({"lanes": lanes, "end": end, "overlap": overlap(lanes),
                     "softmax_cycles": [sum(b - a for a, b in lane["softmax"]) for lane in lanes],
                     "sections": len(cta[0])})
    return {"device": rec["device"], "variant": rec["variant"], "seqlen": rec["seqlen"], "headdim": rec["headdim"],
            "nheads": rec["nheads"], "causal": rec["causal"], "block_m": rec["block_m"], "block_n": rec["block_n"],
            "num_wg": rec["num_wg"], "command": rec.get("command", ""), "ctas": ctas,
            "source": (f"Measured on {rec['device']}: ioattn's Gluon forward ({rec['variant']} variant, "
                       f"{rec['block_m']} x {rec['block_n']} tiles) with its schedule record, "
                       f"`{rec.get('command', 'ioattn bench pingpong-trace')}`; cycles of the SM's clock from "
                       f"each CTA's first stamp")}
