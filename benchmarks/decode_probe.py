"""How long a device-to-host read of a small index tensor takes on this machine (the cost of
``check_values=True`` in ``flash_attn_with_kvcache``), and the host time of one decode call."""
import time

import torch

from ioattn.decode import flash_attn_with_kvcache


def per_call_us(fn, n=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


x = torch.arange(8, device="cuda", dtype=torch.int32)
pinned = torch.empty(8, dtype=torch.int32, pin_memory=True)


def pinned_read():
    pinned.copy_(x, non_blocking=True)
    torch.cuda.current_stream().synchronize()
    return pinned.tolist()


print(f"tolist          {per_call_us(lambda: x.tolist()):8.1f} us")
print(f"item            {per_call_us(lambda: x[0].item()):8.1f} us")
print(f"pinned + sync   {per_call_us(pinned_read):8.1f} us")
print(f"synchronize     {per_call_us(torch.cuda.synchronize):8.1f} us")
q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
kc = torch.randn(1, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
vc = torch.randn_like(kc)
sl = torch.full((1,), 4096, device="cuda", dtype=torch.int32)
print(f"decode checked  {per_call_us(lambda: flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl)):8.1f} us")
print(f"decode trusted  {per_call_us(lambda: flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, check_values=False)):8.1f} us")
