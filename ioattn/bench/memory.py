"""Peak memory of one call above what was allocated before it, on a GPU or on the CPU.

GPU: the caching allocator's own counters (``torch.cuda.max_memory_allocated``).

CPU: PyTorch keeps no such counters for the CPU, so the profiler records every allocation and
free made through PyTorch's CPU allocator during the call (``profile_memory=True``): the outputs,
the autograd buffers and the work buffers PyTorch's kernels allocate inside, with their sizes.
Summed in time order they give the bytes live at each moment; the peak of that sum is the figure.
Blocks allocated before the call are not counted, nor their frees, so the figure is the call's own
high-water mark, the same quantity the GPU counters give. (Resident-set size would not do: the C
library keeps freed memory for reuse, so what the process holds says little about one call.)
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile

import torch

# The profiler's native library announces every session on file descriptor 2 with lines that start
# with this; they are dropped (anything else written there meanwhile is passed on).
PROFILER_BANNER = "USDT:"


def peak_bytes(step, device) -> int:
    """Peak bytes allocated while ``step()`` runs, above those allocated when it starts."""
    return _peak_cuda(step) if torch.device(device).type == "cuda" else _peak_cpu(step)


def _peak_cuda(step):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


def _peak_cpu(step):
    from torch.profiler import ProfilerActivity, profile

    with _banner_filtered(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    return running_peak(allocation_events(prof))


def allocation_events(prof):
    """(time in ns, bytes: + allocated, - freed) of every CPU allocation the profiler saw, in the
    order they happened."""
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError as e:  # a PyTorch whose profiler keeps its events elsewhere
        raise RuntimeError("this PyTorch's profiler gives no allocation events") from e
    cpu = torch._C._autograd.DeviceType.CPU
    found = [(e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.device_type() == cpu]
    return sorted(found, key=lambda t: t[0])  # stable: same-instant events keep their recorded order


def running_peak(events) -> int:
    """The largest running sum of the byte counts of ``events`` ((time, bytes) pairs), from 0."""
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


@contextlib.contextmanager
def _banner_filtered():
    """File descriptor 2 goes to a temporary file for the block; afterwards everything in it except
    the profiler's banner lines is written to stderr."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real descriptor 2 (an embedding host): leave it alone
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
            rest = "".join(ln for ln in text.splitlines(True) if not ln.startswith(PROFILER_BANNER))
            if rest:
                sys.stderr.write(rest)
                sys.stderr.flush()
