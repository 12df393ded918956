"""Bad input raises the same error on every rank, never a hang.

A rank that refused a call alone would leave the others waiting in the ring's first exchange. So
each call first gathers one small int64 vector from every rank (``agree``): whether the rank's own
checks passed, and the fields every rank must share (shapes, dtype, device type, mask, layout, the
packed sequences' lengths). That ``all_gather`` of a few dozen integers is the whole cost of the
check on the good path; on CUDA tensors over NCCL it also waits for the device (the values are
read on the host), which ``check=False`` skips. Only when some rank refused does a second
collective (``all_gather_object``) share the refusals' texts, so that every rank raises the same
exception with the same message.
"""
from __future__ import annotations

import struct

import torch
import torch.distributed as dist

_RAISABLE = {c.__name__: c for c in (TypeError, ValueError, NotImplementedError, RuntimeError)}
# the backends this module knows, and the device types each one serves
_SERVES = {"gloo": {"cpu"}, "nccl": {"cuda"}, "xccl": {"xpu"}, "mpi": {"cpu", "cuda"}, "ucc": {"cpu", "cuda"}}


def group_info(group, fn):
    """(world size, this rank's index) in ``group`` (None: the default group), or a RuntimeError
    saying what is missing: raised alike on every rank, since every rank lacks the same thing."""
    if not dist.is_available():
        raise RuntimeError(f"{fn}: this PyTorch build has no torch.distributed")
    if not dist.is_initialized():
        raise RuntimeError(f"{fn}: the default process group is not initialised: call "
                           f"torch.distributed.init_process_group(...) first (under torchrun, with no arguments)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise RuntimeError(f"{fn}: this process (global rank {dist.get_rank()}) is not in the group it was given")
    return dist.get_world_size(group), rank


def global_rank(group, rank):
    """The default group's rank of ``group``'s rank ``rank`` (what point-to-point calls take)."""
    return rank if group is None else dist.get_global_rank(group, rank)


def served_devices(group):
    """The device types ``group``'s backend serves (``'cpu:gloo,cuda:nccl'`` serves both), or None
    for a backend this module does not know (then nothing is refused on its behalf)."""
    backend = str(dist.get_backend(group)).lower()
    if ":" in backend:
        return {part.split(":")[0] for part in backend.split(",")}
    return _SERVES.get(backend)


def check_device(fn, group, t):
    served = served_devices(group)
    if served is not None and t.device.type not in served:
        raise ValueError(f"{fn}: the tensors are on {t.device}, which the process group's backend "
                         f"({dist.get_backend(group)}) cannot serve (it serves {', '.join(sorted(served))}): "
                         f"move them, or use a group of a backend for {t.device.type}")


def _collective_device(group):
    """Where the check's small tensor lives: the CPU when the backend serves it, else the current GPU."""
    served = served_devices(group)
    if served is None or "cpu" in served:
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def shape_field(t, ndim=4):
    """A tensor's shape as a fixed-length field (-1 pads it; -2 for what is not a tensor)."""
    if not isinstance(t, torch.Tensor):
        return (-2,) * ndim
    return tuple(t.shape[:ndim]) + (-1,) * max(0, ndim - t.dim())


def float_field(x):
    """A float as the int64 of its bits (equal floats, equal fields)."""
    return (struct.unpack("<q", struct.pack("<d", float(x)))[0],)


def agree(fn, group, world, error, fields, floats=()):
    """Raise the same exception on every rank of ``group`` if any rank's ``error`` is set or any
    field differs between ranks; one ``all_gather`` when nothing is wrong.

    ``error``: this rank's refusal (an exception) or None. ``fields``: name -> tuple of ints, the
    same names and lengths on every rank (the checks before this one keep them so); the fields named
    in ``floats`` hold a ``float_field`` and are shown as floats."""
    flat = [1 if error is not None else 0] + [int(x) for v in fields.values() for x in v]
    mine = torch.tensor(flat, dtype=torch.int64, device=_collective_device(group))
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    rows = torch.stack(gathered).tolist()
    refused = [r for r, row in enumerate(rows) if row[0]]
    if refused:
        texts = [None] * world
        dist.all_gather_object(texts, None if error is None else (type(error).__name__, str(error)), group=group)
        name, text = texts[refused[0]]
        where = f"rank {refused[0]}" if len(refused) == 1 else f"ranks {', '.join(map(str, refused))}"
        raise _RAISABLE.get(name, RuntimeError)(f"{text} [refused on {where}]")
    start = 1
    for name, value in fields.items():
        column = [tuple(row[start:start + len(value)]) for row in rows]
        start += len(value)
        if len(set(column)) > 1:
            per_rank = ", ".join(f"rank {r}: {_show(c, name in floats)}" for r, c in enumerate(column))
            raise ValueError(f"{fn}: every rank must pass the same {name}, got {per_rank}")


def _show(value, is_float=False):
    if is_float:
        return repr(struct.unpack("<d", struct.pack("<q", value[0]))[0])
    return str(value[0]) if len(value) == 1 else str(tuple(x for x in value if x != -1))
