"""Context parallelism: exact attention over a sequence sharded across devices, on
``torch.distributed`` (NCCL on GPUs, Gloo on CPUs; started by ``torchrun``). See
docs/distributed.md.

* ``ring_attention``: key/value shards travel around a ring of ranks (``ioattn.distributed.ring``).
* ``ulysses_attention``: an all-to-all trades sequence shards for head shards
  (``ioattn.distributed.ulysses``), alone or over a ring (``ulysses_ring_groups``).
* ``shard`` / ``unshard``: a rank's part of a full tensor in a layout, and back
  (``ioattn.distributed.layout``).
"""
from ioattn.distributed.layout import shard, unshard
from ioattn.distributed.ring import ring_attention
from ioattn.distributed.ulysses import ulysses_attention, ulysses_ring_groups

__all__ = ["ring_attention", "ulysses_attention", "ulysses_ring_groups", "shard", "unshard"]
