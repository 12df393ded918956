import contextlib
import fcntl
import os
import pathlib
import re
import tempfile
import types
import zlib

import torch

# Without a GPU the Triton kernels run under Triton's interpreter; this must be set before any
# kernel module is imported, since @triton.jit reads it at decoration time.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def pytest_addoption(parser):
    parser.addoption("--explainer-screenshots", metavar="DIR", default=None,
                     help="tests/test_explainers.py: save each explainer page at its final step to DIR/<page>.png")
    parser.addoption("--sass", action="store_true",
                     help="run the SASS property checks (marked sass) without a GPU too")
    parser.addoption("--shard", metavar="K/N", default=None,
                     help="run the K-th (from 1) of N contiguous parts of the collected tests: the device suite "
                          "split over commands that each fit a time limit (docs/benchmarks.md)")
    parser.addoption("--resume", metavar="LOG", default=None,
                     help="run only the tests that LOG (the output of an earlier -v run, stopped by a time limit) "
                          "does not report as passed, failed, skipped or errored")
    parser.addoption("--timings", metavar="FILE", default=None,
                     help="append each test's set-up, call and tear-down seconds to FILE as it finishes (a run "
                          "stopped by a time limit keeps them, where --durations prints only at the end)")


def pytest_runtest_logreport(report):
    """``--timings``: one line a phase, ``nodeid<TAB>phase<TAB>seconds<TAB>outcome``."""
    path = _TIMINGS.get("path")
    if path:
        with open(path, "a") as f:
            f.write(f"{report.nodeid}\t{report.when}\t{report.duration:.3f}\t{report.outcome}\n")


_TIMINGS = {}


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # not a pytest-xdist worker: the controller sees every worker's reports
        _TIMINGS["path"] = config.getoption("--timings")


# ---- what this installation cannot run: skipped with the library's own reason ----

def pytest_collection_modifyitems(config, items):
    """Tests marked ``gluon`` (the Gluon Hopper kernels' sm_90 compiles) skip where
    ``ioattn._compat.gluon_status`` keeps the Gluon kernels off, with its reason. Tests marked ``sass``
    (instruction-level properties of the Gluon builds under each compile-time option, and the compile
    matrices past the default builds: every variant, head dim and mask) run where a GPU is, or with
    ``--sass``: the CPU run compiles the default builds at their usual head dims and skips them."""
    from ioattn import _compat

    ok, why = _compat.gluon_status()
    if not ok:
        skip = pytest.mark.skip(reason=f"Gluon kernels off: {why}")
        for item in items:
            if item.get_closest_marker("gluon"):
                item.add_marker(skip)
    if not torch.cuda.is_available() and not config.getoption("--sass"):
        skip = pytest.mark.skip(reason="a compile check past the default builds: the device suite runs it "
                                       "(here: pytest --sass)")
        for item in items:
            if item.get_closest_marker("sass"):
                item.add_marker(skip)
    if config.getoption("--resume"):
        done = _reported(pathlib.Path(config.getoption("--resume")).read_text(errors="replace"))
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in done])
        items[:] = [item for item in items if item.nodeid not in done]
    shard = config.getoption("--shard")
    if shard:
        mine = shard_mask(shard, len(items))
        config.hook.pytest_deselected(items=[item for item, m in zip(items, mine) if not m])
        items[:] = [item for item, m in zip(items, mine) if m]


def shard_mask(spec: str, n: int) -> list:
    """``--shard K/N`` over ``n`` collected tests: whether each is in the K-th (from 1) of N contiguous
    parts."""
    try:
        part, parts = (int(x) for x in spec.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard takes K/N (two integers), got {spec!r}") from None
    if not 1 <= part <= parts:
        raise pytest.UsageError(f"--shard K/N needs 1 <= K <= N, got {spec}")
    return [i * parts // n == part - 1 for i in range(n)]


# Test processes (pytest-xdist workers) share one card. Each test's call holds the card shared; one that
# runs out of device memory runs again holding it alone, so the worker count can follow the cores.
_CARD = pathlib.Path(tempfile.gettempdir()) / "ioattn-tests-card.lock"
_GATE = _CARD.with_suffix(".gate")  # held while a test waits for the card alone: no new call starts


@contextlib.contextmanager
def _flock(path, mode):
    with open(path, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _card_shared():
    with _flock(_GATE, fcntl.LOCK_EX):
        pass
    with _flock(_CARD, fcntl.LOCK_SH):
        yield


@contextlib.contextmanager
def _card_alone():
    with _flock(_GATE, fcntl.LOCK_EX), _flock(_CARD, fcntl.LOCK_EX):
        yield


# a -v run's report of one test: "[gw3] [ 12%] PASSED <id>" under pytest-xdist, "<id> PASSED [ 12%]" without
_OUTCOME = "(?:PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)"
_REPORTED = (re.compile(rf"\[gw\d+\] \[\s*\d+%\] {_OUTCOME} (?P<id>.+?)\s*$"),
             re.compile(rf"(?P<id>.+?) {_OUTCOME}\s+\[\s*\d+%\]$"))


def _reported(log: str) -> set:
    """Node ids that a -v run's output reports an outcome for."""
    return {m.group("id") for line in log.splitlines() for m in (p.match(line) for p in _REPORTED) if m}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test whose call the interpreter refuses (``InterpreterUnsupportedError``: bf16 where this
    Triton's interpreter computes ``tl.dot`` wrongly even with the patches below) is skipped with the
    refusal's text: on such a Triton the refusal is the library's answer, not the test's failure. A test
    that expects the refusal catches it itself (pytest.raises) and is not affected. A test that runs
    out of device memory beside other test processes runs once more with the card to itself."""
    from ioattn._compat import InterpreterUnsupportedError

    try:
        with _card_shared():
            return (yield)
    except InterpreterUnsupportedError as e:
        pytest.skip(f"refused by the interpreter check: {e}")
    except torch.cuda.OutOfMemoryError:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        with _card_alone():
            item.runtest()


@pytest.fixture(autouse=True)
def _fresh_state(request):
    # a fresh but reproducible draw per test (never zeros): the seed comes from the test's name
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    # cached plans are keyed on the switches, not on policy tables a test may patch: none carries over
    from ioattn import backends
    backends.clear_routes()
    yield
    if torch.cuda.is_available():
        # several test processes share one card: hand this test's cached blocks back to the driver
        torch.cuda.empty_cache()


def max_err(a, b):
    return (a.double() - b.double()).abs().nan_to_num(nan=float("inf")).max().item()


def assert_within_torch_error(name, got, ref64, torch_same_dtype, floor=1e-5):
    """flash-attn's criterion: the kernel's error against the float64 oracle is at most twice the
    error of PyTorch's standard attention computed in the same dtype (plus a tiny floor for fp32)."""
    assert not torch.isnan(got).any(), f"{name}: NaN in output"
    err, base = max_err(got, ref64), max_err(torch_same_dtype, ref64)
    assert err <= 2 * base + floor, f"{name}: error {err:.3e} > 2 x torch's {base:.3e} + {floor:g}"


# ---- shared helpers for test_kernels.py / test_api.py (oracle bundles and the 2x criterion) ----

def _leaf(t, dtype=None):
    t = t.detach()
    return (t.to(dtype) if dtype is not None else t.clone()).requires_grad_()


def attention_oracles(q, k, v, dout, **ref_kw):
    """The float64 oracle and PyTorch's same-dtype standard attention for one batched problem.

    Returns a dict with out64, lse64, grads64 (dq, dk, dv of the float64 oracle for ``dout``) and
    out_t, grads_t (the same computed by ``attention_ref(..., upcast=False)`` in the input dtype).
    ``ref_kw`` are ``attention_ref``'s keyword arguments (normalised window, softcap, alibi, ...).
    """
    from ioattn.reference import attention_ref

    q64, k64, v64 = (_leaf(x, torch.float64) for x in (q, k, v))
    out64, lse64 = attention_ref(q64, k64, v64, **ref_kw)
    grads64 = torch.autograd.grad(out64, (q64, k64, v64), dout.detach().double(), allow_unused=True)
    qt, kt, vt = (_leaf(x) for x in (q, k, v))
    out_t, _ = attention_ref(qt, kt, vt, upcast=False, **ref_kw)
    grads_t = torch.autograd.grad(out_t, (qt, kt, vt), dout.detach(), allow_unused=True)
    fix = lambda gs, ref: tuple(torch.zeros_like(r) if g is None else g for g, r in zip(gs, ref))  # noqa: E731
    return dict(out64=out64.detach(), lse64=lse64.detach(), grads64=fix(grads64, (q64, k64, v64)),
                out_t=out_t.detach(), grads_t=fix(grads_t, (qt, kt, vt)))


def assert_lse_close(name, lse, lse64, atol=1e-3):
    """lse against the oracle's: -inf exactly where the oracle is -inf, finite and close elsewhere."""
    assert lse.dtype == torch.float32, f"{name}: lse dtype {lse.dtype}"
    assert lse.shape == lse64.shape, f"{name}: lse shape {tuple(lse.shape)} != {tuple(lse64.shape)}"
    assert not torch.isnan(lse).any(), f"{name}: NaN in lse"
    empty = torch.isneginf(lse64)
    assert torch.equal(torch.isneginf(lse), empty), f"{name}: -inf pattern of lse differs from the oracle's"
    if (~empty).any():
        assert torch.isfinite(lse[~empty]).all(), f"{name}: non-finite lse on rows that see a key"
        err = max_err(lse[~empty], lse64[~empty])
        assert err <= atol, f"{name}: lse error {err:.3e} > {atol:g}"


def assert_matches_oracles(name, out, grads, oracles, floor=1e-5):
    """Output and (dq, dk, dv) within twice PyTorch's own same-dtype error of the float64 oracle."""
    assert out.shape == oracles["out64"].shape and out.dtype == oracles["out_t"].dtype, name
    assert_within_torch_error(f"{name} out", out, oracles["out64"], oracles["out_t"], floor)
    if grads is not None:
        for gname, g, g64, gt in zip(("dq", "dk", "dv"), grads, oracles["grads64"], oracles["grads_t"]):
            assert g.shape == g64.shape, f"{name} {gname}: shape {tuple(g.shape)} != {tuple(g64.shape)}"
            assert torch.isfinite(g).all(), f"{name} {gname}: non-finite gradient"
            assert_within_torch_error(f"{name} {gname}", g, g64, gt, floor)


def fake_launches(monkeypatch, module, kernel: str) -> list:
    """``module.kernel`` (a Gluon kernel) replaced by a fake that records each launch as (grid,
    positional arguments, keyword arguments) in the list returned (no GPU here)."""
    launches = []
    params = getattr(module, kernel).params
    names = [p.name for p in params]
    head = names[:next(i for i, p in enumerate(params) if p.is_constexpr)]

    def record(grid, args, kw):
        # the runtime parameters before the first constexpr positionally, the rest by name, however
        # the launcher passed them
        kw = dict(zip(names, args), **kw)
        launches.append((grid, tuple(kw.pop(n) for n in head if n in kw), kw))

    class Fake:
        def __getitem__(self, grid):
            return lambda *args, **kw: record(grid, args, kw)
    monkeypatch.setattr(module, kernel, Fake())
    return launches


class _PoisonedTorch(types.ModuleType):
    """Stands in for ``torch`` inside ``ioattn.backends``: ``empty``/``empty_like`` return NaN-filled
    floating tensors, so an output element a kernel forgets to write shows up as NaN (which never
    passes a check) instead of whatever the allocator handed back."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def _poison(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    def empty(self, *args, **kwargs):
        return self._poison(torch.empty(*args, **kwargs))

    def empty_like(self, *args, **kwargs):
        return self._poison(torch.empty_like(*args, **kwargs))


@pytest.fixture
def poison_alloc(monkeypatch):
    """Every buffer the launchers allocate with torch.empty/empty_like starts as NaN: the training
    kernels (``ioattn.backends``), the Hopper forward and backward (``ioattn.launch.gluon_fwd``,
    ``ioattn.launch.gluon_bwd``, when this Triton has Gluon), decoding and the merge
    (``ioattn.launch.decode``, ``ioattn.launch.mla``, ``ioattn.launch.merge``)."""
    import ioattn.backends
    import ioattn.launch.decode
    import ioattn.launch.gluon_fwd
    import ioattn.launch.merge
    import ioattn.launch.mla

    modules = [ioattn.backends, ioattn.launch.gluon_fwd, ioattn.launch.decode, ioattn.launch.mla,
               ioattn.launch.merge]
    try:
        import ioattn.launch.gluon_bwd
        modules.append(ioattn.launch.gluon_bwd)
    except ImportError:  # a Triton without Gluon
        pass
    for module in modules:
        monkeypatch.setattr(module, "torch", _PoisonedTorch("torch"))


@pytest.fixture
def tile_override():
    """Yields ``set(kind, TileConfig)``; every override is removed after the test."""
    from ioattn.plan import dispatch

    kinds = []

    def _set(kind, config):
        kinds.append(kind)
        dispatch.set_tile_override(kind, config)

    yield _set
    for kind in kinds:
        dispatch.set_tile_override(kind, None)


# ---- Triton interpreter: bfloat16 ----

def _bf16_to_f32(handle):
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    data = torch.from_numpy(np.ascontiguousarray(handle.data).view(np.int16)).view(torch.bfloat16)
    return TensorHandle(data.float().numpy(), tl.float32)


def _f32_to_bf16_rtne(handle):
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    data = torch.from_numpy(np.ascontiguousarray(handle.data)).to(torch.bfloat16).view(torch.int16)
    return TensorHandle(data.numpy().view(np.uint16), tl.bfloat16)


def _f32_to_e4m3_rne_sat(handle):
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    data = torch.from_numpy(np.ascontiguousarray(handle.data)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return TensorHandle(data.view(torch.uint8).numpy(), tl.float8e4nv)


def _interpreter_bf16_issues():
    """Probe the interpreter: (tl.dot on bf16 operands is wrong, fp32 -> bf16 casts truncate)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _probe(a_ptr, x_ptr, c_ptr, y_ptr, n: tl.constexpr):
        r = tl.arange(0, n)
        a = tl.load(a_ptr + r[:, None] * n + r[None, :])
        tl.store(c_ptr + r[:, None] * n + r[None, :], tl.dot(a, a))
        tl.store(y_ptr + r, tl.load(x_ptr + r).to(tl.bfloat16))

    a = torch.arange(256, dtype=torch.float32).view(16, 16).remainder(5).sub(2).to(torch.bfloat16)
    x = 1.0 + torch.arange(16, dtype=torch.float32) * (2.0 ** -10)  # between bf16 neighbours
    c, y = torch.empty(16, 16), torch.empty(16, dtype=torch.bfloat16)
    _probe[(1,)](a, x, c, y, n=16)
    return not torch.equal(c, a.float() @ a.float()), not torch.equal(y, x.to(torch.bfloat16))


@pytest.fixture(scope="session", autouse=True)
def _interpreter_bf16():
    """Make Triton's interpreter compute bfloat16 the way the GPU does (no effect on CUDA).

    The interpreter stores bfloat16 as uint16 and (triton 3.6.0)
    * ``create_dot`` multiplies the raw bit patterns of bf16 operands (results ~1e10;
      triton-lang/triton#11584: "the interpreter does not support operations on bfloat16");
    * ``cast_impl`` turns fp32 into bf16 by truncating the mantissa, where the GPU's fptrunc
      rounds to nearest even; the kernels' ``p.to(bf16)`` before ``p @ V`` then carries a one-sided
      bias that accumulates over the keys (2-3x PyTorch's error in dv, gone with RTNE).
    * ``create_fp_to_fp`` turns fp32 into e4m3 losing the rounding's carry into the exponent (125.99 ->
      64), flushing subnormals and without saturating.
    Each is patched only if the probe shows it: bf16 dot operands are converted to fp32 (bf16
    products are exact in fp32, accumulation is fp32 as on tensor cores) and fp32 -> bf16 / e4m3
    casts round to nearest even (torch's conversion; e4m3 saturating at ±448 as the GPU's
    ``cvt.satfinite``). Nothing else changes.
    """
    from ioattn import _compat
    if os.environ.get("TRITON_INTERPRET") != "1" or _compat.interpreter_numpy_problem():
        yield  # (an interpreter that cannot run here: every interpreted call is refused, and skipped)
        return
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder

    dot_broken, cast_truncates = _interpreter_bf16_issues()
    e4m3_wrong = not _compat._probe_e4m3_cast()[0]
    original_dot, original_cast = InterpreterBuilder.create_dot, InterpreterBuilder.cast_impl
    original_fp_to_fp = InterpreterBuilder.create_fp_to_fp

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16:
            a = _bf16_to_f32(a)
        if b.dtype.scalar == tl.bfloat16:
            b = _bf16_to_f32(b)
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return _f32_to_bf16_rtne(src)
        return original_cast(self, src, dst_type)

    def fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:
            return _f32_to_e4m3_rne_sat(src)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    if dot_broken:
        InterpreterBuilder.create_dot = create_dot
    if cast_truncates:
        InterpreterBuilder.cast_impl = cast_impl
    if e4m3_wrong:
        InterpreterBuilder.create_fp_to_fp = fp_to_fp
    # the library's bf16 probe, judged now on the patched interpreter (its verdict is kept for the
    # session): bf16 tests run where the patches make bf16 right, and skip where they do not
    _compat.interpreter_bf16_status()
    _compat.interpreter_e4m3_status()
    try:
        yield
    finally:
        InterpreterBuilder.create_dot, InterpreterBuilder.cast_impl = original_dot, original_cast
        InterpreterBuilder.create_fp_to_fp = original_fp_to_fp


@pytest.fixture
def one_thread():
    """Tiny-tensor tests: torch's intra-op threads only add synchronisation (10x slower on a loaded
    2-core machine), so run them on one thread and restore the setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rotary_tables(seqlen_ro, rotary_dim, dtype=torch.float32, device="cpu"):
    """cos/sin tables (seqlen_ro, rotary_dim / 2) of the usual 10000^(-2j/d) frequencies, and theta."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    theta = torch.arange(seqlen_ro, dtype=torch.float64)[:, None] * inv_freq[None]
    return theta.cos().to(dtype).to(device), theta.sin().to(dtype).to(device), theta


def assert_varlen_sequences(name, q, k, v, dout, out, lse, grads, cu_q, cu_k, lse_atol=1e-3, seq_kw=None, **ref_kw):
    """A packed (varlen) result, one sequence at a time, against the float64 oracle of that sequence
    (``ref_kw`` for every sequence, ``seq_kw(i)`` for sequence i's own, e.g. its ALiBi slopes): out,
    lse (nheads, total_q) and (dq, dk, dv). A sequence with no queries leaves dk, dv zero; one with
    no keys gives out 0, lse -inf and dq 0."""
    dq, dk, dv = grads
    cql, ckl = cu_q.tolist(), cu_k.tolist()
    for i in range(len(cql) - 1):
        sq, sk = slice(cql[i], cql[i + 1]), slice(ckl[i], ckl[i + 1])
        lq, lk = cql[i + 1] - cql[i], ckl[i + 1] - ckl[i]
        if lq == 0:
            assert (dk[sk] == 0).all() and (dv[sk] == 0).all(), f"{name} seq {i}"
            continue
        if lk == 0:
            assert (out[sq] == 0).all() and torch.isneginf(lse[:, sq]).all() and (dq[sq] == 0).all(), f"{name} seq {i}"
            continue
        oracles = attention_oracles(q[sq][None], k[sk][None], v[sk][None], dout[sq][None], **ref_kw,
                                    **(seq_kw(i) if seq_kw else {}))
        label = f"{name} seq {i} ({lq}x{lk})"
        assert_matches_oracles(label, out[sq][None], (dq[sq][None], dk[sk][None], dv[sk][None]), oracles)
        assert_lse_close(label, lse[:, sq][None], oracles["lse64"].float(), atol=lse_atol)


def child_env():
    """The environment of a child Python process the tests start: without the interpreter, and with
    this checkout first on the path (the package need not be installed, as on a device machine)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(pathlib.Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def run_cli(argv, capsys):
    """(exit status, stdout, stderr) of ``ioattn ARGV`` run in this process."""
    from ioattn import cli

    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err
