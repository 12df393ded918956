"""Compile the Gluon Hopper forward for sm_90 without a GPU (as compile_check.py does for the Triton
kernels): every (head dim, dtype, mask) the dispatch can pick, at ``ioattn.hopper.TILES``. Prints shared
memory and counts of wgmma, TMA and register-reallocation (setmaxnreg) instructions in the PTX."""
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from ioattn.hopper import TILES
from ioattn.kernels.hopper_forward import hopper_fwd_kernel as fn

H200_SHARED_BYTES = 232448

for d, (bm, bn, stages) in TILES.items():
    for dt, gdt in (("bf16", gl.bfloat16), ("fp16", gl.float16)):
        for causal in (False, True):
            q_layout = gl.NVMMASharedLayout.get_default_for([bm, d], gdt)
            kv_layout = gl.NVMMASharedLayout.get_default_for([bn, d], gdt)
            sig = {n: "i32" for n in fn.arg_names}
            sig.update(q_desc=f"tensordesc<{dt}[{bm},{d}],{q_layout!r}>",
                       k_desc=f"tensordesc<{dt}[{bn},{d}],{kv_layout!r}>",
                       v_desc=f"tensordesc<{dt}[{bn},{d}],{kv_layout!r}>", Out=f"*{dt}", Lse="*fp32", qk_scale="fp32")
            c = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, IS_CAUSAL=causal)
            sig.update({k: "constexpr" for k in c})
            k = triton.compile(GluonASTSource(fn, sig, c), target=GPUTarget("cuda", 90, 32),
                               options=dict(num_warps=4 * (bm // 64)))
            ptx = k.asm["ptx"]
            assert k.metadata.shared <= H200_SHARED_BYTES, (d, dt, causal, k.metadata.shared)
            assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx and "setmaxnreg" in ptx
            print(f"hopper_fwd_kernel d={d} {dt} causal={causal} tiles={bm}x{bn}x{stages} shared={k.metadata.shared} "
                  f"wgmma={ptx.count('wgmma.mma_async')} tma={ptx.count('cp.async.bulk.tensor')} "
                  f"setmaxnreg={ptx.count('setmaxnreg')}")
print("hopper kernel compiled for sm_90")
