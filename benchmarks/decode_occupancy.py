"""Registers, spills and shared memory of every decode split kernel the calls below compile, and the
programs per SM they allow on this GPU (the SM's 64K registers and its shared memory), with the
step time of each call: what a wave of the decode grid is (``decode._tail_split`` counts waves in
SMs).

    python benchmarks/decode_occupancy.py

bf16, 32 query / 8 KV heads, d=128, full caches of 4096 keys; batches 1, 17, 24, 64, 68, 100.
"""
import torch

from ioattn.decode import flash_attn_with_kvcache
from ioattn.bench.timing import median_ms
from ioattn.kernels.decode import decode_split_kernel
from ioattn.plan import decode


def main():
    props = torch.cuda.get_device_properties(0)
    smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
    regs_sm = getattr(props, "regs_per_multiprocessor", 65536)
    print(f"SMs {props.multi_processor_count}, shared per SM {smem}, registers per SM {regs_sm}")
    for batch in (1, 17, 24, 64, 68, 100):
        q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
        lens = torch.full((batch,), 4096, device="cuda", dtype=torch.int32)
        plan = decode.plan(q, k, k, False, 4096)
        us = median_ms(lambda s: flash_attn_with_kvcache(q, k, k, cache_seqlens=lens, check_values=False),
                       [None]) * 1e3
        print(f"batch {batch}: {plan}  {us:.1f} us (L2-warm: one input set)")
    for dev, caches in decode_split_kernel.device_caches.items():
        for key, kern in caches[0].items():
            kern._init_handles()
            threads = kern.metadata.num_warps * 32
            by_regs = regs_sm // (max(kern.n_regs, 1) * threads)
            by_smem = smem // max(kern.metadata.shared, 1)
            print(f"kernel: regs {kern.n_regs} spills {kern.n_spills} shared {kern.metadata.shared} warps "
                  f"{kern.metadata.num_warps} stages {kern.metadata.num_stages} -> programs/SM "
                  f"min(regs {by_regs}, shared {by_smem})")


if __name__ == "__main__":
    main()
