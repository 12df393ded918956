"""Launching a Triton kernel without re-deriving its specialization at every call.

``kernel[grid](*args, **kw)`` specializes every argument again at each launch (type, alignment,
divisibility by 16), hashes the result and looks the compiled kernel up: for the decode kernel's ~60
arguments that was the largest part of a decode call's host time (``benchmarks/host_profile.py``;
docs/decisions/decode-launches.md). A decode loop launches the same kernel with the same shapes at every step, so
``CachedLaunch`` keeps the compiled kernel under a key built from what decides Triton's
specialization: each integer's value, each tensor's dtype and 16-byte alignment, each descriptor's
block, dtype, shape and strides, the constexprs and the launch options; then launches it through
its launcher directly. A key seen for the first time (or an interpreter run, or a call with
``cached=False``: the plan's ``dispatch.cached_launch()``) goes through Triton's own path, which
compiles when needed.

Limits, by design: floats are keyed by type only (Triton passes every float as fp32 and never
specializes on its value); a kernel whose globals change after compilation is not re-checked (ours
have none); the cache holds ``maxsize`` keys and is cleared when full.
"""
from __future__ import annotations


import torch
import triton
from triton.runtime.jit import JITFunction


def _desc_key(a):
    base = a.base
    return ("desc", base.dtype, base.data_ptr() % 16 == 0, tuple(a.shape), tuple(a.strides), tuple(a.block_shape))


def _arg_key(a):
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, (bool, int)) or a is None:
        return a if not isinstance(a, bool) else ("b", a)
    if isinstance(a, float):
        return float
    if hasattr(a, "block_shape") and hasattr(a, "base"):  # triton.tools.tensor_descriptor.TensorDescriptor
        return _desc_key(a)
    raise TypeError(f"CachedLaunch: no key for an argument of type {type(a).__name__}")


class CachedLaunch:
    """``CachedLaunch(fn)(grid, args, constexprs)``: ``fn[grid](*args, **constexprs)`` with the
    compiled kernel kept per specialization key. ``args``: the runtime arguments in order (every
    parameter before the first constexpr); ``constexprs``: the constexpr parameters and launch
    options (num_warps, num_stages, maxnreg, launch_pdl) by name."""

    def __init__(self, fn, maxsize: int = 256):
        self.fn = fn
        self.maxsize = maxsize
        self._kernels: dict = {}
        params = getattr(fn, "params", None)
        self._ok = isinstance(fn, JITFunction) and params is not None
        if self._ok:
            first = next((i for i, p in enumerate(params) if p.is_constexpr), len(params))
            # the direct launch passes runtime arguments positionally, then every constexpr by position
            self._ok = all(p.is_constexpr for p in params[first:])
            self._n_runtime = first
            self._const_names = [p.name for p in params[first:]]
            self._const_defaults = {p.name: p.default for p in params[first:]}

    def enabled(self) -> bool:
        """Whether the kernel can be launched directly (its constexprs after its runtime arguments)."""
        return self._ok

    def __call__(self, grid, args, constexprs, cached: bool = True):
        if not (cached and self._ok):
            return self.fn[grid](*args, **constexprs)
        assert len(args) == self._n_runtime, (len(args), self._n_runtime)
        device = triton.runtime.driver.active.get_current_device()
        # ints (most arguments: sizes and strides) are their own key; a call site passes its
        # constexprs in one order, so their items need no sorting
        key = (device, tuple([a if type(a) is int else _arg_key(a) for a in args]), tuple(constexprs.items()))
        entry = self._kernels.get(key)
        if entry is None:
            kernel = self.fn[grid](*args, **constexprs)
            if hasattr(kernel, "run") and hasattr(kernel, "packed_metadata"):  # a compiled kernel (not async)
                if len(self._kernels) >= self.maxsize:
                    self._kernels.clear()
                tail = tuple(constexprs.get(n, self._const_defaults[n]) for n in self._const_names)
                self._kernels[key] = (kernel, tail)
            return
        kernel, tail = entry
        stream = triton.runtime.driver.active.get_current_stream(device)
        g = tuple(grid) + (1, 1)
        knobs = triton.knobs.runtime
        kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata,
                   kernel.launch_metadata(grid, stream, *args, *tail), knobs.launch_enter_hook,
                   knobs.launch_exit_hook, *args, *tail)


_LAUNCHERS: dict = {}


def launcher_for(fn) -> CachedLaunch:
    """The one ``CachedLaunch`` of kernel ``fn`` (made on first use)."""
    launch = _LAUNCHERS.get(fn)
    if launch is None:
        launch = _LAUNCHERS[fn] = CachedLaunch(fn)
    return launch


class BoundLaunch:
    """Launches of kernel ``fn`` whose specialization the caller's own cache key fixes.

    ``static``: the arguments that are the same at every launch under that key (sizes, strides,
    scalars, constexprs), by parameter name; ``dynamic``: the names of the ones that change (tensors,
    descriptors), passed to ``__call__`` in that order, which keep the dtype, 16-byte alignment and
    descriptor blocks of the first launch's; ``options``: num_warps and the like. The first launch
    (and any on another device, or with ``direct=False``) goes through ``fn[grid]``, which compiles;
    the later ones call the compiled kernel's launcher with the arguments in parameter order, without
    Triton's per-launch binding, specialization and cache lookup."""

    def __init__(self, fn, static: dict, dynamic: tuple, options: dict, direct: bool = True):
        self.fn, self.static, self.dynamic, self.options = fn, static, tuple(dynamic), options
        self.kernel = self.device = None
        params = getattr(fn, "params", None)
        self.direct = direct and isinstance(fn, JITFunction) and params is not None
        if self.direct:
            names = [p.name for p in params]
            unknown = (set(static) | set(self.dynamic)) - set(names)
            if unknown:
                raise TypeError(f"BoundLaunch: {sorted(unknown)} are not parameters of {fn.__name__}")
            missing = [p.name for p in params if not p.has_default and p.name not in static and p.name not in dynamic]
            if missing:
                raise TypeError(f"BoundLaunch: {fn.__name__} needs {missing}")
            self.template = [static[p.name] if p.name in static else p.default for p in params]
            self.slots = [names.index(n) for n in self.dynamic]

    def __call__(self, grid, *values):
        kernel = self.kernel
        device = triton.runtime.driver.active.get_current_device() if self.direct else None
        if kernel is None or device != self.device:
            kernel = self.fn[grid](**self.static, **dict(zip(self.dynamic, values)), **self.options)
            if self.direct and self.kernel is None and hasattr(kernel, "run") and hasattr(kernel, "packed_metadata"):
                self.kernel, self.device = kernel, device
            return
        args = self.template.copy()
        for i, value in zip(self.slots, values):
            args[i] = value
        stream = triton.runtime.driver.active.get_current_stream(device)
        g = tuple(grid) + (1, 1)
        knobs = triton.knobs.runtime
        kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata,
                   kernel.launch_metadata(grid, stream, *args), knobs.launch_enter_hook, knobs.launch_exit_hook,
                   *args)
