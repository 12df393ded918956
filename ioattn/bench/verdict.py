"""The correctness check every sweep runs before it times anything, and how its verdict reads.

A provider passes when, for every tensor checked (the output, and dq, dk, dv when the sweep times a
backward), its largest error against the float64 oracle is at most twice the error PyTorch's own
standard attention makes in the same dtype, plus ``FLOOR`` (flash-attn's criterion; the floor keeps
an fp32 bound from being a rounding error's width).
"""
from __future__ import annotations

import math
from typing import NamedTuple

FLOOR = 1e-4
BOUND_TEXT = f"2 x PyTorch's own same-dtype error + {FLOOR:g}"


class Verdict(NamedTuple):
    ok: bool
    err: float                  # the output's largest error against the float64 oracle
    bound: float | None = None  # the output's allowed error
    parts: dict | None = None   # tensor name -> (err, bound): the output and, when checked, dq, dk, dv

    def worst(self):
        """(name, err, bound) of the checked tensor nearest to its bound (or furthest past it)."""
        parts = self.parts or {"out": (self.err, self.bound)}
        return max(((k, e, b) for k, (e, b) in parts.items()), key=lambda t: _excess(t[1], t[2]))

    def fields(self):
        """What a record keeps of it: ``max_err`` (the output's, as records always had),
        ``err_bound`` and, per tensor, ``check``."""
        out = {"max_err": self.err}
        if self.bound is not None:
            out["err_bound"] = self.bound
        if self.parts:
            out["check"] = {k: {"max_err": e, "err_bound": b} for k, (e, b) in self.parts.items()}
        return out

    def failure(self):
        name, err, bound = self.worst()
        past = "" if bound is None else f" > bound {bound:.3g}"
        return f"failed the correctness check ({name} max err {err:.3g}{past})"


def as_verdict(result) -> Verdict:
    """A ``Verdict`` from a check's result (a bare ``(ok, err)`` pair is accepted too)."""
    return result if isinstance(result, Verdict) else Verdict(*result)


def _excess(err, bound):
    if err is None or math.isnan(err):
        return math.inf
    return err / bound if bound else err


def judge(got: dict, oracle: dict, same: dict) -> Verdict:
    """``got``, ``oracle`` (float64) and ``same`` (PyTorch's standard attention in the input dtype):
    tensor name -> tensor, the same names in each."""
    parts = {}
    for name, ref in oracle.items():
        err = _max_err(got[name], ref)
        parts[name] = (err, 2 * _max_err(same[name], ref) + FLOOR)
    ok = all(not math.isnan(e) and e <= b for e, b in parts.values())
    err, bound = parts["out"]
    return Verdict(ok, err, bound, parts if len(parts) > 1 else None)


def _max_err(a, ref):
    return (a.double() - ref).abs().max().item()


def outputs(fn, q, k, v, dout=None) -> dict:
    """``fn(q, k, v)`` on leaf copies of the inputs: {"out": ...}, and with ``dout`` the gradients
    {"dq", "dk", "dv"} of ``out`` against it too."""
    import torch  # here, not at the top: the report reads ``BOUND_TEXT`` without loading PyTorch

    leaves = tuple(t.detach().requires_grad_(dout is not None) for t in (q, k, v))
    with torch.set_grad_enabled(dout is not None):
        out = fn(*leaves)
    got = {"out": out.detach()}
    if dout is not None:
        got.update(zip(("dq", "dk", "dv"), torch.autograd.grad(out, leaves, dout.to(out.dtype))))
    return got


def line(provider: str, where: str, v: Verdict) -> str:
    """One verdict, e.g. ``check ioattn  d=64 causal=0 n=512: max err 2.4e-07 (dq) <= bound 1.0e-04  pass``."""
    name, err, bound = v.worst()
    head = f"check {provider:<15} {where}: max err {err:.2e} ({name})"
    if bound is None:
        return f"{head}  {'pass' if v.ok else 'FAIL'}"
    return f"{head} {'<=' if v.ok else '> '} bound {bound:.2e}  {'pass' if v.ok else 'FAIL'}"
