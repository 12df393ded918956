"""ioattn._compat: the tested version ranges and their import warning, the Gluon check and its fallback
to the portable kernels, the interpreter's bf16 probe and refusal, and the package's build.

Tests marked ``interpreter`` are the quick subset of the Triton kernels under the interpreter
(forward, backward, decode, merge at small shapes, fp32 / fp16, bf16 right or refused) that CI also
runs on the newest Triton: ``pytest -m interpreter``."""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import warnings
import zipfile

import pytest
import torch
import triton

import ioattn
from conftest import (DEVICE, assert_lse_close, assert_matches_oracles, assert_varlen_sequences,
                      assert_within_torch_error, attention_oracles)
from ioattn import _compat
from ioattn.plan import dispatch, hopper
from ioattn.plan import hopper_bwd
from ioattn._compat import InterpreterUnsupportedError, UnsupportedVersionWarning
from ioattn.reference import attention_ref
from ioattn.reference.merge import merge_states_ref

ROOT = pathlib.Path(__file__).resolve().parents[1]
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
_CANNOT_INTERPRET = ("runs the Triton kernels under TRITON_INTERPRET=1" if not INTERPRETED
                     else _compat.interpreter_numpy_problem())
needs_interpreter = pytest.mark.skipif(bool(_CANNOT_INTERPRET), reason=str(_CANNOT_INTERPRET))
DTYPES = [torch.float32, torch.float16]


# ---------------------------------------------------------------- versions

def test_version_parsing_and_ranges():
    assert _compat.version_tuple("2.13.0+cpu") == (2, 13, 0)
    assert _compat.version_tuple("3.10") == (3, 10, 0)
    assert _compat.version_tuple("3.7.0rc1") == (3, 7, 0)
    assert _compat.version_tuple("unknown") == ()
    assert _compat.in_range("3.9.0", ("3.6", "3.10")) and _compat.in_range("3.6.0", ("3.6", "3.10"))
    assert not _compat.in_range("3.10.0", ("3.6", "3.10")) and not _compat.in_range("3.5.1", ("3.6", "3.10"))
    assert not _compat.in_range("dev", ("3.6", "3.10"))


def test_pyproject_states_the_tested_ranges():
    """pyproject.toml's dependencies and _compat's ranges (which the warning and explain use) agree."""
    tomllib = pytest.importorskip("tomllib")
    path = ROOT / "pyproject.toml"
    if not path.exists():
        pytest.skip("no source tree (an installed package)")
    deps = tomllib.loads(path.read_text())["project"]["dependencies"]
    lo, hi = _compat.TORCH_RANGE
    assert f"torch>={lo},<{hi}" in deps, deps
    lo, hi = _compat.TRITON_RANGE
    assert f"triton>={lo},<{hi}" in deps, deps
    assert f"numpy>={_compat.NUMPY_MIN}" in deps, deps
    # the Gluon kernels' releases lie inside the supported ones
    assert _compat.version_tuple(_compat.TRITON_RANGE[0]) <= _compat.version_tuple(_compat.GLUON_TRITON[0])
    assert _compat.version_tuple(_compat.GLUON_TRITON[1]) <= _compat.version_tuple(_compat.TRITON_RANGE[1])


def test_out_of_range_versions_warn_once(monkeypatch):
    monkeypatch.setattr(_compat, "_warned", False)
    assert _compat.unsupported_versions("2.13.0", "3.6.0") is None
    assert _compat.unsupported_versions("2.11.0", "3.9.0") is None
    with pytest.warns(UnsupportedVersionWarning) as record:
        message = _compat.warn_unsupported_versions("2.13.0", "3.10.1")
    assert len(record) == 1 and str(record[0].message) == message
    assert "triton 3.10.1 (tested: >=3.6,<3.10)" in message and "Gluon Hopper kernels are off" in message
    assert "portable Triton kernels run instead" in message and "torch" not in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second finding: the text, no second warning
        assert _compat.warn_unsupported_versions("2.10.0", "3.5.0") is not None

    monkeypatch.setattr(_compat, "_warned", False)
    with pytest.warns(UnsupportedVersionWarning, match=r"torch 2\.14\.0 \(tested: >=2\.11,<2\.14\): nothing falls back"):
        _compat.warn_unsupported_versions("2.14.0", "3.6.0")


def test_import_warns_once_for_versions_outside_the_ranges():
    """The warning comes from ``import ioattn`` itself, once, however many modules import the check."""
    code = ("import torch, triton\n"
            "torch.__version__ = '2.99.0'\n"
            "triton.__version__ = '3.99.0'\n"
            "import ioattn, ioattn.explain, ioattn.decode, ioattn.plan.hopper\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run([sys.executable, "-W", "always::UserWarning", "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "UnsupportedVersionWarning" in line]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "triton 3.99.0" in lines[0] and "torch 2.99.0" in lines[0] and "Gluon Hopper kernels are off" in lines[0]


# ---------------------------------------------------------------- Gluon

def _fake_hopper(monkeypatch, gluon_ok: bool, why: str = "Triton 9.9.9: not the Gluon API the kernels are written against"):
    """As if on an sm_90 GPU, with the Gluon check's verdict ``gluon_ok`` (and an interpreter that runs
    with this numpy: the plans are the subject here)."""
    monkeypatch.setattr(hopper, "_on_sm90", lambda q: True)
    monkeypatch.setattr(_compat, "interpreter_numpy_problem", lambda: None)
    monkeypatch.setattr(_compat, "gluon_status", lambda: (gluon_ok, why))
    return why


def test_gluon_status_on_this_triton():
    """Inside GLUON_TRITON the kernels' names must all be found (else the GPU machine would lose them
    silently); outside it the reason names this Triton's version."""
    ok, why = _compat.gluon_status()
    if _compat.in_range(triton.__version__, _compat.GLUON_TRITON):
        pytest.importorskip("triton.experimental.gluon")
        assert ok, why
    else:
        assert not ok and f"Triton {triton.__version__}" in why and "portable Triton kernels" in why


def test_gluon_feature_detection_names_what_is_missing(monkeypatch):
    pytest.importorskip("triton.experimental.gluon")
    monkeypatch.setattr(_compat, "GLUON_TRITON", ("0.0", "999.0"))  # past the release gate, to the names
    names = _compat._GLUON_NAMES + (("triton.experimental.gluon.language", ("no_such_gluon_name",)),
                                    ("triton.experimental.no_such_module", ("x",)))
    monkeypatch.setattr(_compat, "_GLUON_NAMES", names)
    ok, why = _compat.gluon_status.__wrapped__()
    assert not ok and "language.no_such_gluon_name" in why and "triton.experimental.no_such_module" in why, why
    monkeypatch.setattr(_compat, "GLUON_TRITON", ("0.0", "0.1"))  # the release gate
    ok, why = _compat.gluon_status.__wrapped__()
    assert not ok and f"Triton {triton.__version__}" in why and "3.6's Gluon API" in why, why


def test_gluon_incompatible_falls_back_to_the_portable_kernels(monkeypatch):
    """On an sm_90 GPU (faked) with a Triton whose Gluon the check rejects, the plan takes the portable
    kernels and says why; with the check passing, the same call takes the Gluon kernels."""
    from ioattn.semantics import Semantics
    q = torch.randn(1, 64, 2, 128, dtype=torch.float16)
    with dispatch.forced_backend("triton"), hopper.prefer_hopper(True), hopper_bwd.prefer_hopper_bwd(True):
        _fake_hopper(monkeypatch, True)
        plan = ioattn.explain_dispatch(q, q, q)
        assert plan.forward["gluon_hopper"].startswith("taken") and "hopper_fwd_kernel" in plan.forward["kernel"]
        assert plan.backward["gluon_hopper"].startswith("taken")

        why = _fake_hopper(monkeypatch, False)
        plan = ioattn.explain_dispatch(q, q, q)
        assert plan.forward["kernel"] == "ioattn.kernels.forward.attn_fwd_kernel"
        assert plan.forward["gluon_hopper"] == f"not applicable ({why})"
        assert plan.backward["gluon_hopper"] == f"not taken ({why})"
        assert "gluon_api" not in plan.forward  # the reason is given once
        assert f"gluon_hopper=not applicable ({why})" in plan.describe()
        assert hopper.fwd_plan(q, q, q, False, Semantics(0.125, (-1, -1)), None) == (False, why)
        assert hopper_bwd.bwd_plan(q, q, q, False, Semantics(0.125, (-1, -1)), None) == (False, why)


def test_gluon_reason_shown_off_hopper_too(monkeypatch):
    """Without an sm_90 GPU the device is the reason, and the Gluon check's verdict has its own field."""
    q = torch.randn(1, 64, 2, 128, dtype=torch.float16)
    why = "Triton 9.9.9: not the Gluon API the kernels are written against"
    monkeypatch.setattr(_compat, "gluon_status", lambda: (False, why))
    monkeypatch.setattr(_compat, "interpreter_numpy_problem", lambda: None)
    with dispatch.forced_backend("triton"):
        plan = ioattn.explain_dispatch(q, q, q)
    assert plan.forward["gluon_hopper"].startswith("not applicable (needs an sm_90")
    assert plan.forward["gluon_api"] == f"off ({why})" and f"gluon_api=off ({why})" in plan.describe()
    monkeypatch.setattr(_compat, "gluon_status", lambda: (True, "Triton 3.6.0's Gluon API"))
    with dispatch.forced_backend("triton"):
        assert "gluon_api" not in ioattn.explain_dispatch(q, q, q).forward


@needs_interpreter
@pytest.mark.interpreter
def test_gluon_incompatible_call_runs_the_portable_kernels(monkeypatch):
    """The call itself, not only the plan: with Gluon rejected on a (faked) sm_90 GPU the portable
    kernels compute it (the Gluon launcher would fail on CPU tensors)."""
    _fake_hopper(monkeypatch, False)
    q, k, v = (torch.randn(1, 40, 2, 64, dtype=torch.float16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    with hopper.prefer_hopper(True), hopper_bwd.prefer_hopper_bwd(True):
        out = ioattn.flash_attn_func(q, k, v, causal=True)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    assert_matches_oracles("gluon off", out.detach(), grads, attention_oracles(q, k, v, dout, window=(-1, 0)))


# ---------------------------------------------------------------- the interpreter: bf16

@pytest.fixture
def bf16_broken(monkeypatch):
    """The probe's verdict set to broken, and the calls' route the interpreter's (one that runs with
    this numpy, so the bf16 refusal is the one raised)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(_compat, "interpreter_numpy_problem", lambda: None)
    detail = "a 16 x 16 bf16 tl.dot probe is off by 1.5e+10 (set by the test)"
    monkeypatch.setattr(_compat, "_bf16_verdict", (False, detail))
    return detail


@needs_interpreter
@pytest.mark.interpreter
def test_bf16_refused_where_the_probe_finds_dot_broken(bf16_broken):
    q = torch.randn(1, 33, 2, 32, dtype=torch.bfloat16)
    with pytest.raises(InterpreterUnsupportedError) as err:
        ioattn.flash_attn_func(q, q, q, causal=True)
    message = str(err.value)
    assert f"Triton {triton.__version__}'s interpreter" in message and bf16_broken in message
    assert "float16 or float32" in message and "unset TRITON_INTERPRET" in message
    with pytest.raises(InterpreterUnsupportedError, match=re.escape(f"Triton {triton.__version__}")):
        ioattn.flash_attn_with_kvcache(q[:, :1], q, q, cache_seqlens=20)
    plan = ioattn.explain_dispatch(q, q, q)
    assert plan.backend == "refused" and plan.reason == message
    # other dtypes, and the checks without a dtype (explain, merge), pass
    cpu = torch.device("cpu")
    assert dispatch.use_triton(cpu, torch.float16) and dispatch.use_triton(cpu, torch.float32)
    assert dispatch.use_triton(cpu)


@needs_interpreter
@pytest.mark.interpreter
def test_bf16_not_refused_on_cuda_or_the_pytorch_path(bf16_broken, monkeypatch):
    """The refusal is the interpreter's only: without TRITON_INTERPRET the CPU call takes the PyTorch
    path and bf16 is fine."""
    monkeypatch.delenv("TRITON_INTERPRET")
    q = torch.randn(1, 33, 2, 32, dtype=torch.bfloat16)
    out = ioattn.flash_attn_func(q, q, q)
    ref = attention_ref(q.double(), q.double(), q.double())[0]
    assert (out.double() - ref).abs().max() < 2e-2


@needs_interpreter
@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp32_fp16_still_run_where_bf16_is_refused(bf16_broken, dtype):
    q, k, v = (torch.randn(1, 37, 2, 32, dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    out = ioattn.flash_attn_func(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert_matches_oracles(f"{dtype} with bf16 refused", out.detach(), grads, attention_oracles(q, k, v, dout))


def test_bf16_verdict_is_probed_once(monkeypatch):
    calls = []
    monkeypatch.setattr(_compat, "_bf16_verdict", None)
    monkeypatch.setattr(_compat, "_probe_bf16_dot", lambda: calls.append(1) or (True, "fine"))
    assert _compat.interpreter_bf16_status() == (True, "fine")
    assert _compat.interpreter_bf16_status() == (True, "fine") and len(calls) == 1
    assert _compat.bf16_refusal() is None


@needs_interpreter
@pytest.mark.interpreter
def test_bf16_probe_detects_a_wrong_dot(monkeypatch):
    """The probe itself, on the interpreter: a tl.dot that multiplies its operands in the wrong order
    is caught (the probe's operands do not commute); the interpreter as this session runs it (with
    conftest's bf16 patches) passes."""
    from triton.runtime.interpreter import InterpreterBuilder

    current = InterpreterBuilder.create_dot
    monkeypatch.setattr(InterpreterBuilder, "create_dot", lambda self, a, b, *rest, **kw: current(self, b, a, *rest, **kw))
    ok, detail = _compat._probe_bf16_dot()
    assert not ok and "off by" in detail, detail
    monkeypatch.setattr(InterpreterBuilder, "create_dot", current)
    if not _compat.interpreter_bf16_status()[0]:
        pytest.skip(f"bf16 is wrong on this interpreter even with conftest's patches: {_compat.bf16_refusal()}")
    assert _compat._probe_bf16_dot()[0]


def test_interpreter_numpy_check(monkeypatch):
    """Triton 3.6's interpreter with numpy >= 2.4 is refused with what to install; newer pairs pass."""
    def problem(triton_v, numpy_v):
        monkeypatch.setattr(_compat, "triton_version", lambda: triton_v)
        monkeypatch.setattr(_compat, "numpy_version", lambda: numpy_v)
        return _compat.interpreter_numpy_problem.__wrapped__()

    text = problem("3.6.0", "2.4.1")
    assert "Triton 3.6.0's interpreter" in text and "numpy 2.4.1" in text and "'numpy<2.4'" in text, text
    assert problem("3.6.0", "2.3.5") is None and problem("3.7.1", "2.4.6") is None and problem("3.9.0", "2.4.6") is None
    assert "not installed" in problem("3.9.0", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(_compat, "interpreter_numpy_problem", lambda: text)
    with pytest.raises(InterpreterUnsupportedError, match="numpy 2.4.1"):
        ioattn.flash_attn_func(*(torch.randn(1, 8, 1, 16) for _ in range(3)))


# ---------------------------------------------------------------- the interpreter subset

_CASES = {
    # name: (batch, seqlen_q, seqlen_k, nheads, nheads_kv, d, keyword arguments)
    "causal-gqa": (2, 45, 70, 4, 2, 40, dict(causal=True)),
    "window-softcap-alibi": (1, 50, 50, 2, 2, 32, dict(window_size=(12, 5), softcap=5.0)),
}


@needs_interpreter
@pytest.mark.interpreter
@pytest.mark.parametrize("case", list(_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_interpreter_forward_backward(case, dtype, one_thread):
    batch, sq, sk, h, hkv, d, kw = _CASES[case]
    q = torch.randn(batch, sq, h, d, dtype=dtype, device=DEVICE, requires_grad=True)
    k, v = (torch.randn(batch, sk, hkv, d, dtype=dtype, device=DEVICE, requires_grad=True) for _ in range(2))
    dout = torch.randn_like(q)
    ref_kw = {}
    if kw.get("causal"):
        ref_kw["window"] = (-1, 0)
    if "window_size" in kw:
        ref_kw["window"] = kw["window_size"]
        ref_kw["softcap"] = kw["softcap"]
        kw = dict(kw, alibi_slopes=torch.tensor([0.3, 0.05], device=DEVICE))
        ref_kw["alibi_slopes"] = kw["alibi_slopes"]
    out, lse, _ = ioattn.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    oracles = attention_oracles(q, k, v, dout, **ref_kw)
    assert_matches_oracles(case, out.detach(), grads, oracles)
    assert_lse_close(case, lse, oracles["lse64"].float())


@needs_interpreter
@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_interpreter_varlen(dtype, one_thread):
    cu = torch.tensor([0, 17, 17, 60], dtype=torch.int32, device=DEVICE)  # one empty sequence
    cu_k = torch.tensor([0, 30, 41, 66], dtype=torch.int32, device=DEVICE)
    q = torch.randn(60, 2, 24, dtype=dtype, device=DEVICE, requires_grad=True)
    k, v = (torch.randn(66, 1, 24, dtype=dtype, device=DEVICE, requires_grad=True) for _ in range(2))
    dout = torch.randn_like(q)
    out, lse, _ = ioattn.flash_attn_varlen_func(q, k, v, cu, cu_k, 43, 30, causal=True, return_attn_probs=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert_varlen_sequences("varlen", q, k, v, dout, out.detach(), lse, grads, cu, cu_k, window=(-1, 0))


@needs_interpreter
@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_interpreter_decode(dtype, one_thread):
    """One new token a sequence appended to a KV cache, then attention over each sequence's prefix."""
    batch, cap, h, hkv, d = 2, 80, 4, 2, 32
    q = torch.randn(batch, 1, h, d, dtype=dtype, device=DEVICE)
    k_cache, v_cache = (torch.randn(batch, cap, hkv, d, dtype=dtype, device=DEVICE) for _ in range(2))
    k_new, v_new = (torch.randn(batch, 1, hkv, d, dtype=dtype, device=DEVICE) for _ in range(2))
    lens = torch.tensor([23, 64], dtype=torch.int32, device=DEVICE)
    out, lse = ioattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens,
                                             return_softmax_lse=True)
    for b, n in enumerate((lens + 1).tolist()):
        assert torch.equal(k_cache[b, n - 1], k_new[b, 0]) and torch.equal(v_cache[b, n - 1], v_new[b, 0])
        args = (q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n])
        ref64, lse64 = attention_ref(*(t.double() for t in args))
        assert_within_torch_error(f"decode seq {b}", out[b:b + 1], ref64, attention_ref(*args, upcast=False)[0])
        assert (lse[b] - lse64[0].float()).abs().max() < 1e-3


@needs_interpreter
@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_interpreter_merge(dtype, one_thread):
    q = torch.randn(2, 5, 3, 24, dtype=torch.float64, device=DEVICE)
    k, v = (torch.randn(2, 90, 3, 24, dtype=torch.float64, device=DEVICE) for _ in range(2))
    full, full_lse = attention_ref(q, k, v)
    outs, lses = [], []
    for a, b in ((0, 31), (31, 31), (31, 90)):  # an empty part: lse -inf, out 0
        o, lse = attention_ref(q, k[:, a:b], v[:, a:b])
        outs.append(o.to(dtype))
        lses.append(lse.transpose(1, 2).float())
    out, lse = ioattn.merge_attention_states(outs, lses)
    ref_out, ref_lse = merge_states_ref(torch.stack(outs), torch.stack(lses))
    tol = 1e-5 if dtype == torch.float32 else 5e-3
    assert out.dtype == dtype and (out.double() - full).abs().max() < tol
    assert (out.double() - ref_out.double()).abs().max() < tol
    assert (lse.double() - full_lse.transpose(1, 2)).abs().max() < 1e-5
    assert (lse - ref_lse).abs().max() < 1e-5


@needs_interpreter
@pytest.mark.interpreter
def test_interpreter_bf16_right_or_refused(one_thread):
    """bf16 under this session's interpreter: right where the probe passes, refused where it fails,
    never wrong numbers."""
    q, k, v = (torch.randn(1, 40, 2, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    if _compat.interpreter_bf16_status()[0]:
        out = ioattn.flash_attn_func(q, k, v, causal=True)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        assert_matches_oracles("bf16", out.detach(), grads, attention_oracles(q, k, v, dout, window=(-1, 0)))
    else:
        with pytest.raises(InterpreterUnsupportedError, match=re.escape(f"Triton {triton.__version__}")):
            ioattn.flash_attn_func(q, k, v, causal=True)


# ---------------------------------------------------------------- the package

def test_wheel_holds_every_module_and_the_metadata(tmp_path):
    """Builds the wheel offline with the installed setuptools (as ``python -m build`` would, without
    its isolated environment) from a copy of the source, and checks it holds every module of ``ioattn``
    (``ioattn.kernels``, ``reference``, ``bench``, ``kvcache`` ...), the license and the dependency ranges."""
    if not (ROOT / "pyproject.toml").exists():
        pytest.skip("no source tree (an installed package)")
    setuptools = pytest.importorskip("setuptools")
    if _compat.version_tuple(setuptools.__version__) < (77,):
        pytest.skip(f"setuptools {setuptools.__version__}: the build needs >= 77 (the [test] extra installs it)")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "ioattn", src / "ioattn", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proc = subprocess.run([sys.executable, "-c", "from setuptools import build_meta; print(build_meta.build_wheel('dist'))"],
                          cwd=src, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    wheel = src / "dist" / proc.stdout.split()[-1]
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "ioattn").rglob("*.py") if "__pycache__" not in p.parts}
    assert modules and not modules - names, sorted(modules - names)
    for package in ("ioattn/kernels/", "ioattn/reference/", "ioattn/bench/", "ioattn/kvcache/", "ioattn/explainers/"):
        assert f"{package}__init__.py" in names, package
    assets = {p.relative_to(ROOT).as_posix() for p in (ROOT / "ioattn" / "explainers").glob("*.*") if p.suffix != ".py"}
    assert assets and not assets - names, sorted(assets - names)  # the pages' templates, stylesheet, script
    info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert f"{info}/licenses/LICENSE" in names
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: BSD-3-Clause" in metadata
    requires = set(re.findall(r"^Requires-Dist: ([^;\n]+)$", metadata, re.M))
    lo, hi = _compat.TORCH_RANGE
    assert f"torch<{hi},>={lo}" in requires or f"torch>={lo},<{hi}" in requires, requires
    lo, hi = _compat.TRITON_RANGE
    assert f"triton<{hi},>={lo}" in requires or f"triton>={lo},<{hi}" in requires, requires
    assert f"numpy>={_compat.NUMPY_MIN}" in requires, requires
