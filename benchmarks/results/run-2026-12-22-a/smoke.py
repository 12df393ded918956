import torch
from ioattn import hopper
from ioattn.kernels import hopper_backward as hb
hb.WS_EXTRA_ROWS = {128: 16}
q, k, v = (torch.randn(2, 1000, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
out, lse = hopper.hopper_forward(q, k, v, 128 ** -0.5, False)
g = hb.hopper_backward(torch.randn_like(q), q, k, v, out, lse, 128 ** -0.5, False, variant="ws")
torch.cuda.synchronize()
print("smoke ok", [t.float().abs().max().item() for t in g])
