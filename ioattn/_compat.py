"""What this installation's PyTorch, Triton and numpy can run, checked once and reported in words.

* Versions. ``TORCH_RANGE`` and ``TRITON_RANGE`` are the releases ioattn is tested on (pyproject.toml's
  dependencies say the same; a test keeps the two equal). Outside them the first ``import ioattn``
  warns once (``UnsupportedVersionWarning``), naming what falls back.
* Gluon (``gluon_status``). The Hopper kernels (``ioattn.kernels.hopper_forward`` / ``hopper_backward``)
  are written against Triton 3.6's Gluon API. Gluon is experimental and changes between releases in
  ways a check of names cannot see: Triton 3.9 keeps ``tma.async_copy_global_to_shared`` as a stub
  that raises when a kernel compiles, and from 3.7 on Triton calls the compile-stage hook (which the
  forward's PTX pass uses) with no arguments to key its cache; 3.7 and 3.8 compile the kernels, with
  other register budgets, but no build of theirs was run or measured on a GPU. So the rule is a
  tested-release range, ``GLUON_TRITON``, and inside it a check that every Gluon name the kernels
  import is there; anywhere else the portable Triton kernels run and ``gluon_status`` gives the
  one-line reason that ``explain_dispatch`` shows.
* Programmatic dependent launch (``grid_dependency_control``): whether this Triton has the grid
  dependency control the decode kernels use to launch behind the previous kernel.
* Triton's interpreter (``TRITON_INTERPRET=1``: CPU tensors through the Triton kernels).
  ``check_interpreter`` refuses, with ``InterpreterUnsupportedError``, what it would compute wrongly:
  bfloat16 where a probe of bf16 ``tl.dot`` (run once, on the first bf16 call) disagrees with torch,
  float8_e4m3fn where a probe of the fp32 -> e4m3 conversion does,
  and any call on an interpreter that cannot run with the installed numpy (``interpreter_numpy_problem``).
"""
from __future__ import annotations

import functools
import inspect
import importlib
import re
import warnings

import torch

# [lowest, first untested) releases: each lower bound a release the tests ran on, each upper bound the
# minor release after the newest one they ran on.
# - torch: 2.11 is the GPU machine's, 2.13 CI's CPU build. Below: the custom ops, fake kernels and
#   torch.compile paths of ioattn.autograd never ran there. From 2.14: not run yet.
# - triton: 3.6 is the GPU machine's and CI's pinned release (the Gluon kernels' own); 3.9 passes the
#   whole CPU suite with the Gluon kernels off, 3.7 and 3.8 the interpreter subset. Below 3.6: never
#   run. From 3.10: each minor release so far changed something the tests use (3.7 the compile-stage
#   hook's protocol and where divisibility hints land, 3.9 the ptxas and PTX version for sm_90).
TORCH_RANGE = ("2.11", "2.14")
TRITON_RANGE = ("3.6", "3.10")
# the Triton releases the Gluon kernels were compiled, run and measured with
GLUON_TRITON = ("3.6", "3.7")
# the lowest numpy tested (torch warns at import without numpy; the interpreter computes with it). No
# upper bound: ioattn never calls numpy, and the one pair known to fail is reported at run time below.
NUMPY_MIN = "2.2"
# Triton releases below this one turn a one-element array into a loop bound with int(), which numpy
# makes an error from ``INTERPRETER_NUMPY_LIMIT`` on
INTERPRETER_INT_FIX = "3.7"
INTERPRETER_NUMPY_LIMIT = "2.4"

PORTABLE_NOTE = "the portable Triton kernels run instead"


class UnsupportedVersionWarning(UserWarning):
    """torch or triton outside the tested ranges (``TORCH_RANGE``, ``TRITON_RANGE``)."""


class InterpreterUnsupportedError(RuntimeError):
    """A call that Triton's interpreter, on this installation, would compute wrongly or not at all."""


def version_tuple(text) -> tuple[int, ...]:
    """(major, minor, patch) of a version string ("2.13.0+cpu" -> (2, 13, 0), "3.10" -> (3, 10, 0));
    () when it does not start with a number."""
    m = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    return tuple(int(x or 0) for x in m.groups()) if m else ()


def in_range(version, bounds) -> bool:
    """``bounds[0] <= version < bounds[1]``, by release numbers (an unreadable version is outside)."""
    v = version_tuple(version)
    return bool(v) and version_tuple(bounds[0]) <= v < version_tuple(bounds[1])


def _spec(bounds) -> str:
    return f">={bounds[0]},<{bounds[1]}"


def triton_version() -> str:
    import triton
    return triton.__version__


def numpy_version() -> str | None:
    try:
        import numpy
    except ImportError:
        return None
    return numpy.__version__


# ---- versions: one warning at import ----

def unsupported_versions(torch_version: str | None = None, triton_ver: str | None = None) -> str | None:
    """The warning's text for these versions (default: the installed ones), or None inside the ranges."""
    torch_version = torch.__version__ if torch_version is None else torch_version
    triton_ver = triton_version() if triton_ver is None else triton_ver
    parts = []
    if not in_range(triton_ver, TRITON_RANGE):
        parts.append(f"triton {triton_ver} (tested: {_spec(TRITON_RANGE)}): the Gluon Hopper kernels are "
                     f"off ({PORTABLE_NOTE}); the rest runs untested")
    if not in_range(torch_version, TORCH_RANGE):
        parts.append(f"torch {torch_version} (tested: {_spec(TORCH_RANGE)}): nothing falls back; untested")
    return "ioattn: " + "; ".join(parts) if parts else None


_warned = False


def warn_unsupported_versions(torch_version: str | None = None, triton_ver: str | None = None) -> str | None:
    """Warn (``UnsupportedVersionWarning``) the first time it finds torch or triton outside the tested
    ranges; returns the text (None inside them)."""
    global _warned
    message = unsupported_versions(torch_version, triton_ver)
    if message and not _warned:
        _warned = True
        warnings.warn(message, UnsupportedVersionWarning, stacklevel=3)
    return message


# ---- Gluon: the Hopper kernels or the portable ones ----

# (module, attribute paths) the Gluon kernels and their host code use
_GLUON_NAMES = (
    ("triton.experimental.gluon", ("jit", "constexpr_function")),
    ("triton.experimental.gluon.language", (
        "constexpr", "static_assert", "allocate_shared_memory", "warp_specialize", "convert_layout",
        "thread_barrier", "inline_asm_elementwise", "static_range", "NVMMASharedLayout",
        "NVMMADistributedLayout", "SharedLinearLayout", "BlockedLayout", "SliceLayout", "DotOperandLayout")),
    ("triton.experimental.gluon.language._core", ("builtin",)),
    ("triton.experimental.gluon.language.nvidia.hopper", (
        "fence_async_shared", "warpgroup_mma", "warpgroup_mma_init", "warpgroup_mma_wait",
        "mbarrier.init", "mbarrier.wait", "mbarrier.arrive", "mbarrier.expect", "mbarrier.MBarrierLayout",
        "tma.async_copy_global_to_shared", "tma.async_copy_shared_to_global", "tma.store_wait")),
    ("triton.experimental.gluon.nvidia.hopper", ("TensorDescriptor",)),
    ("triton._C.libtriton.ir", ("DESCRIPTOR_REDUCE_KIND.ADD",)),
    ("triton.knobs", ("runtime.add_stages_inspection_hook",)),
)


def _missing_gluon_names() -> list[str]:
    """The names of ``_GLUON_NAMES`` this Triton lacks, and warp_specialize's signature where it is not
    3.6's (a list of (function, args) partitions, then the workers' warps and registers)."""
    missing = []
    for module_name, paths in _GLUON_NAMES:
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - an import that fails for any reason means no such module here
            missing.append(module_name)
            continue
        for path in paths:
            obj = module
            try:
                for part in path.split("."):
                    obj = getattr(obj, part)
            except AttributeError:
                missing.append(f"{module_name.rsplit('.', 1)[-1]}.{path}")
    if not missing:
        from triton.experimental.gluon import language as gl
        params = list(inspect.signature(gl.warp_specialize).parameters)
        if params[:3] != ["functions_and_args", "worker_num_warps", "worker_num_regs"]:
            missing.append(f"warp_specialize({', '.join(params[:3])}, ...) as 3.6 has it")
    return missing


@functools.cache
def gluon_status() -> tuple[bool, str]:
    """(usable, why): whether the Gluon Hopper kernels may run with this Triton; ``why`` is one line."""
    try:
        version = triton_version()
    except ImportError:
        return False, "no Triton"
    if not in_range(version, GLUON_TRITON):
        return False, (f"Triton {version}: the Gluon kernels are written against Triton 3.6's Gluon API and run "
                       f"only on triton{_spec(GLUON_TRITON)}; {PORTABLE_NOTE}")
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:
        return False, "this Triton has no Gluon"
    missing = _missing_gluon_names()
    if missing:
        return False, f"Triton {version}'s Gluon lacks {', '.join(missing)}; {PORTABLE_NOTE}"
    return True, f"Triton {version}'s Gluon API"


# ---- programmatic dependent launch ----

@functools.cache
def grid_dependency_control() -> bool:
    """Whether this Triton has grid dependency control (``gdc_wait``, ``gdc_launch_dependents``), which
    kernels launched by programmatic dependent launch use (the decode split kernel and the merge)."""
    try:
        module = importlib.import_module("triton.language.extra.cuda")
    except ImportError:
        return False
    return hasattr(module, "gdc_wait")


# ---- the interpreter ----

_bf16_verdict: tuple[bool, str] | None = None


def _probe_bf16_dot() -> tuple[bool, str]:
    """Run a 16 x 16 bf16 ``tl.dot`` under the interpreter against torch's product. The operands are
    small integers, exact in bf16 and whose products and sums are exact in fp32, so any difference is
    the interpreter's."""
    import triton
    import triton.language as tl

    @triton.jit
    def _bf16_dot_probe(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
        r = tl.arange(0, N)
        tile = r[:, None] * N + r[None, :]
        tl.store(c_ptr + tile, tl.dot(tl.load(a_ptr + tile), tl.load(b_ptr + tile)))

    n = 16
    cells = torch.arange(n * n, dtype=torch.float32).view(n, n)
    a = (cells.remainder(7) - 3).to(torch.bfloat16)
    b = (cells.remainder(5) - 2).t().contiguous().to(torch.bfloat16)
    c = torch.full((n, n), float("nan"))
    try:
        _bf16_dot_probe[(1,)](a, b, c, N=n)
    except Exception as e:  # noqa: BLE001 - any failure of the probe is a verdict, reported with its text
        return False, f"a 16 x 16 bf16 tl.dot probe raised {type(e).__name__}: {str(e)[:200]}"
    err = (c - a.float() @ b.float()).abs().max().item()
    if not err == 0.0:  # also NaN
        return False, f"a 16 x 16 bf16 tl.dot probe is off by {err:.3g} where torch's product is exact"
    return True, "a 16 x 16 bf16 tl.dot probe matches torch"


def interpreter_bf16_status() -> tuple[bool, str]:
    """(correct, detail) for bf16 under this process's interpreter: the probe runs on the first call
    and its verdict is kept."""
    global _bf16_verdict
    if _bf16_verdict is None:
        _bf16_verdict = _probe_bf16_dot()
    return _bf16_verdict


@functools.cache
def interpreter_numpy_problem() -> str | None:
    """Why the interpreter cannot run any kernel with this Triton and numpy, or None."""
    triton_v, numpy_v = triton_version(), numpy_version()
    if numpy_v is None:
        return (f"Triton {triton_v}'s interpreter (TRITON_INTERPRET=1) needs numpy, which is not installed: "
                "pip install numpy")
    if (version_tuple(triton_v) < version_tuple(INTERPRETER_INT_FIX)
            and version_tuple(numpy_v) >= version_tuple(INTERPRETER_NUMPY_LIMIT)):
        return (f"Triton {triton_v}'s interpreter (TRITON_INTERPRET=1) cannot run with numpy {numpy_v}: it "
                f"converts one-element arrays to loop bounds with int(), an error from numpy "
                f"{INTERPRETER_NUMPY_LIMIT} on. Install 'numpy<{INTERPRETER_NUMPY_LIMIT}' or "
                f"'triton>={INTERPRETER_INT_FIX}', or unset TRITON_INTERPRET to run CPU tensors on ioattn's "
                "PyTorch path")
    return None


_e4m3_verdict: tuple[bool, str] | None = None


def _probe_e4m3_cast() -> tuple[bool, str]:
    """Convert fp32 values to e4m3 in a kernel, against torch's conversion (round to nearest even):
    values that round up across a power of two (125.99 -> 128) and small ones."""
    import triton
    import triton.language as tl

    @triton.jit
    def _e4m3_cast_probe(x_ptr, y_ptr, N: tl.constexpr):
        r = tl.arange(0, N)
        tl.store(y_ptr + r, tl.load(x_ptr + r).to(tl.float8e4nv))

    x = torch.tensor([125.99, 31.94, 1.0, 0.3, 448.0, 3.0e-3, 0.5, 7.99])
    y = torch.zeros(8, dtype=torch.float8_e4m3fn)
    try:
        _e4m3_cast_probe[(1,)](x, y, N=8)
    except Exception as e:  # noqa: BLE001 - any failure of the probe is a verdict, reported with its text
        return False, f"an fp32 -> e4m3 cast probe raised {type(e).__name__}: {str(e)[:200]}"
    got, want = y.float(), x.to(torch.float8_e4m3fn).float()
    if not torch.equal(got, want):
        i = int((got != want).nonzero()[0, 0])
        return False, f"an fp32 -> e4m3 cast probe gives {got[i].item():g} for {x[i].item():g} (torch: {want[i].item():g})"
    return True, "an fp32 -> e4m3 cast probe matches torch"


def interpreter_e4m3_status() -> tuple[bool, str]:
    """(correct, detail) for e4m3 conversions under this process's interpreter (probed once)."""
    global _e4m3_verdict
    if _e4m3_verdict is None:
        _e4m3_verdict = _probe_e4m3_cast()
    return _e4m3_verdict


def e4m3_refusal() -> str | None:
    """The refusal's text where e4m3 conversions under this interpreter are wrong, else None."""
    ok, detail = interpreter_e4m3_status()
    if ok:
        return None
    return (f"float8_e4m3fn refused under Triton {triton_version()}'s interpreter (TRITON_INTERPRET=1): its "
            f"fp32 -> e4m3 conversion is wrong ({detail}), so the FP8 kernels would return wrong numbers. "
            "Unset TRITON_INTERPRET to run CPU tensors on ioattn's PyTorch path")


def bf16_refusal() -> str | None:
    """The refusal's text where bf16 under this interpreter is wrong (the probe's verdict), else None."""
    ok, detail = interpreter_bf16_status()
    if ok:
        return None
    return (f"bfloat16 refused under Triton {triton_version()}'s interpreter (TRITON_INTERPRET=1): it computes "
            f"bf16 tl.dot wrongly ({detail}), so the kernels would return wrong numbers. Use float16 or "
            "float32, or unset TRITON_INTERPRET to run CPU tensors on ioattn's PyTorch path")


def check_interpreter(dtype: torch.dtype | None) -> None:
    """Raise ``InterpreterUnsupportedError`` where the interpreter cannot compute a call in ``dtype``."""
    problem = interpreter_numpy_problem()
    if problem is None and dtype == torch.bfloat16:
        problem = bf16_refusal()
    if problem is None and dtype == torch.float8_e4m3fn:
        problem = e4m3_refusal()
    if problem is not None:
        raise InterpreterUnsupportedError(problem)
