"""What one kernel launch costs on the device under the bench's timing (an event before and after each
call, ``ioattn.bench.timing.median_ms``): an empty Triton kernel with 4 arguments and with 64, a
PyTorch fill of one element, and the decode step at batch 64 x 4096 (one kernel a call) for ioattn
(with and without its programmatic dependent launch) and cuDNN, in three interleaved rounds.
The question (docs/decisions/decode-launches.md): at 64 x 4096 the bench times ioattn's call 3.2 us over its kernel's span in
the device timeline and cuDNN's 1.9 us over its own; is that the launch of a kernel with ~60 arguments?

    python benchmarks/launch_overhead.py
"""
import statistics
import sys

import torch
import triton
import triton.language as tl

from ioattn.bench.providers import decode_providers
from ioattn.bench.run import _decode_inputs
from ioattn.bench.timing import median_ms


@triton.jit
def _empty4(X, a, b, c):
    tl.store(X + tl.program_id(0), a + b + c)


@triton.jit
def _empty64(X, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20,
             a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38, a39, a40,
             a41, a42, a43, a44, a45, a46, a47, a48, a49, a50, a51, a52, a53, a54, a55, a56, a57, a58, a59, a60,
             a61, a62):
    tl.store(X + tl.program_id(0), a0 + a62)


def main():
    x = torch.zeros(1024, device="cuda", dtype=torch.int32)
    args62 = [i + 3 for i in range(63)]  # not 1 and not multiples of 16: no specialisation folds them
    from ioattn.decode import decode_config
    inputs = _decode_inputs((64, 4096, 32, 8, 128), torch.bfloat16, "cuda")
    table = decode_providers(["ioattn", "sdpa-cudnn"])
    base = table["ioattn"][0](*inputs)

    def nowait():
        with decode_config(pdl_wait=False):
            return base()
    calls = {
        "triton 4 args": lambda: _empty4[(132,)](x, 3, 5, 7),
        "triton 64 args": lambda: _empty64[(132,)](x, *args62),
        "torch fill": lambda: x[:1].fill_(3),
        "ioattn 64x4096": base,
        "ioattn 64x4096 pdl_wait=0": nowait,
        "cudnn 64x4096": table["sdpa-cudnn"][0](*inputs),
    }
    times = {n: [] for n in calls}
    order = list(calls)
    for r in range(3):
        for n in order[r % len(order):] + order[:r % len(order)]:
            times[n].append(median_ms(lambda f: f(), [calls[n]]) * 1e3)
    for n in order:
        print(f"{n:<28} {statistics.median(times[n]):9.2f} us  ({'/'.join(f'{t:.2f}' for t in times[n])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
