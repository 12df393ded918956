"""How fast the special-function unit computes exp2 in each precision PTX offers on sm_90 (docs/decisions/exp2-emulation.md).

ptxas 12.8 lowers ``ex2.approx.f16x2`` / ``ex2.approx.ftz.bf16x2`` (one instruction for two values)
to two scalar ``MUFU.EX2.F16`` / ``MUFU.EX2.BF16`` and a PRMT; whether those scalar forms issue
faster than the fp32 ``MUFU.EX2`` only a measurement says. Each variant is one Triton kernel: every
thread runs ``CHAINS`` independent chains x <- 2^-x (bounded: the chain settles near 0.64), ``ITERS``
steps of ``UNROLL`` inline-PTX exponentials each, on enough warps per SM that the unit, not the
chain's latency, sets the pace. Reported: exponentials per second (a packed instruction counts two)
and the ratio to fp32.

    python benchmarks/mufu_probe.py [--json OUT.json]      # on the GPU
    python benchmarks/mufu_probe.py --sass                 # locally: the SASS each variant compiles to
"""
import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile

import triton
import triton.language as tl

UNROLL = 16  # exponentials a chain per asm block
CHAINS = 4  # independent chains a thread (elements of the block a thread holds)
# variant -> (PTX body on a 32-bit register t, values an instruction computes)
VARIANTS = {
    "f32": ("neg.f32 t, t;\nex2.approx.ftz.f32 t, t;", 1, ".f32"),
    "f16x2": ("neg.f16x2 t, t;\nex2.approx.f16x2 t, t;", 2, ".b32"),
    "bf16x2": ("neg.bf16x2 t, t;\nex2.approx.ftz.bf16x2 t, t;", 2, ".b32"),
    "f16": ("neg.f16 h, h;\nex2.approx.f16 h, h;", 1, ".b16"),
}


def asm_for(name: str) -> str:
    body, _, kind = VARIANTS[name]
    if kind == ".b16":  # the low half as a 16-bit register
        return ("{ .reg .b16 h, hh; mov.b32 {h, hh}, $1;\n" + "\n".join([body] * UNROLL)
                + "\nmov.b32 $0, {h, hh}; }")
    return "{ .reg " + kind + " t; mov.b32 t, $1;\n" + "\n".join([body] * UNROLL) + "\nmov.b32 $0, t; }"


@triton.jit
def _chain_kernel(x_ptr, out_ptr, iters, ASM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for _ in range(iters):
        x = tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(out_ptr + offs, x)


def sass_of(cubin: bytes) -> str:
    bindir = triton.__path__[0] + "/backends/nvidia/bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([bindir + "/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout


def sass(name: str, num_warps: int = 8) -> str:
    """The variant's SASS, compiled here for sm_90 (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    block = 32 * num_warps * CHAINS
    src = ASTSource(_chain_kernel, {"x_ptr": "*i32", "out_ptr": "*i32", "iters": "i32", "ASM": "constexpr",
                                    "BLOCK": "constexpr"}, {"ASM": asm_for(name), "BLOCK": block})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))
    return sass_of(k.asm["cubin"])


def mufu_lines(text: str) -> dict:
    """Counts of each MUFU.EX2 form in a SASS listing."""
    return dict(collections.Counter(re.findall(r"MUFU\.EX2(?:\.[A-Z0-9]+)?", text)))


def run(num_warps: int = 8, iters: int = 256) -> list:
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    block = 32 * num_warps * CHAINS
    programs = sms * 8  # 8 programs of 8 warps an SM resident at a time (64 warps), several waves
    rows = []
    for name, (_, per_instr, _) in VARIANTS.items():
        x = torch.full((programs * block,), 0x3F003F00, dtype=torch.int32, device="cuda")  # 0.5-ish in each form
        out = torch.empty_like(x)
        asm = asm_for(name)
        handle = _chain_kernel[(programs,)](x, out, iters, ASM=asm, BLOCK=block, num_warps=num_warps)  # compile
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            _chain_kernel[(programs,)](x, out, iters, ASM=asm, BLOCK=block, num_warps=num_warps)
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        ms = sorted(times)[len(times) // 2]
        instrs = programs * block * iters * UNROLL
        finite = bool(torch.isfinite(out.view(torch.float32)).all()) if name == "f32" else None
        rows.append(dict(variant=name, ms=ms, mufu=mufu_lines(sass_of(handle.asm["cubin"])), exp_per_s=instrs * per_instr / (ms * 1e-3),
                         instr_per_s=instrs / (ms * 1e-3), finite=finite))
    base = rows[0]["exp_per_s"]
    for r in rows:
        r["ratio_to_f32"] = r["exp_per_s"] / base
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sass", action="store_true", help="print each variant's MUFU lines (no GPU needed)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.sass:
        for name in VARIANTS:
            text = sass(name)
            other = collections.Counter(m for m in re.findall(r"\b(PRMT|HADD2|HFMA2[.A-Z0-9_]*|FADD|F2F)\b", text))
            print(f"{name}: {mufu_lines(text)} {dict(other)}")
        return 0
    rows = run()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{'variant':8} {'ms':>8} {'Gexp/s':>9} {'Ginstr/s':>9} {'vs f32':>7}  SASS")
    for r in rows:
        print(f"{r['variant']:8} {r['ms']:8.3f} {r['exp_per_s'] / 1e9:9.0f} {r['instr_per_s'] / 1e9:9.0f} "
              f"{r['ratio_to_f32']:7.2f}  {r['mufu']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
