"""Ahead-of-time sm_90 compilation of Gluon kernels without a GPU, and what the compile checks read
from the result: instruction counts in the PTX and ptxas -v's registers, spills and warnings. Shared
by tools/compile_check_hopper.py (forward) and compile_check_hopper_bwd.py (backward)."""
import collections
import concurrent.futures
import multiprocessing
import os
import re
import subprocess
import tempfile

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

H200_SHARED_BYTES = 232448  # 227 KB: the most one block may opt in to (228 KB per SM)
# ptxas: "wgmma.mma_async instructions are serialized due to ...": C7514 (non-wgmma instructions on the
# accumulators inside the pipeline stage), C7512 (insufficient register resources; an "info" line,
# missed by a C7514-only match once: docs/decisions/hopper-backward-kernel.md), and any other reason it gives
SERIALIZED = "wgmma.mma_async instructions are serialized"
DTYPES = {"bf16": gl.bfloat16, "fp16": gl.float16}


def compile_sm90(fn, sig, constexprs, num_warps, aligned=()):
    """``sig``: the non-constexpr arguments' types; every constexpr parameter must be given (one
    left out would compile as an i32 argument, not as its default). ``aligned``: arguments compiled
    as divisible by 16 (pointers: 16-byte aligned), as Triton specialises them at run time for
    aligned tensors and integers that are multiples of 16 (vector loads and stores show in the SASS
    only then)."""
    missing = [fn.arg_names[i] for i in fn.constexprs if fn.arg_names[i] not in constexprs]
    assert not missing, missing
    sig = dict(sig, **{k: "constexpr" for k in constexprs})
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    return triton.compile(GluonASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps))


def ptx_counts(ptx):
    """wgmma (commit groups, waits by depth), TMA copies, setmaxnreg (op, value), mbarrier operations
    (init by arrival count, arrive, expect_tx, try_wait), named barriers ("bar.sync id/threads"),
    global atomics and async-proxy fences."""
    bars = collections.Counter()
    for kind, op, bid, n in re.findall(r"\b(bar|barrier)\.(sync|arrive)(?:\.aligned)?\s+(\d+)(?:,\s*(\d+))?;", ptx):
        bars[f"{kind}.{op} {bid}" + (f"/{n}" if n else "")] += 1
    return dict(
        wgmma=ptx.count("wgmma.mma_async"), commit=ptx.count("wgmma.commit_group"),
        waits=dict(collections.Counter(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+);", ptx))),
        tma=ptx.count("cp.async.bulk.tensor"),
        setmaxnreg=collections.Counter(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx)),
        mb_init=collections.Counter(re.findall(r"mbarrier\.init\.shared(?:::cta)?\.b64\s*\[[^\]]+\],\s*(\d+);", ptx)),
        mb_arrive=len(re.findall(r"mbarrier\.arrive\.shared::cta\.b64", ptx)),
        mb_expect=ptx.count("mbarrier.arrive.expect_tx"), mb_wait=ptx.count("mbarrier.try_wait"), bars=bars,
        atomics=dict(collections.Counter(re.findall(r"\b((?:atom|red)(?:\.[a-z0-9_:]+)*\.add(?:\.[a-z0-9]+)*)", ptx))),
        fence_proxy=ptx.count("fence.proxy.async"))


def _ptxas_path():
    """The ptxas Triton itself runs for sm_90 (``get_ptxas(90)``): ``knobs.nvidia.ptxas`` up to Triton 3.8,
    the newer CUDA's ptxas-blackwell from 3.9 on, whose PTX ISA version the compiler then emits."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError:
        return knobs.nvidia.ptxas.path
    return get_ptxas(90).path


def ptxas_report(ptx):
    """ptxas -v on the PTX: (registers, spill bytes stored and loaded, named barriers used, the line
    saying ptxas serialised the wgmmas (C7514, C7512, ...) or '')."""
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{tmp}/k.ptx"
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([_ptxas_path(), "-v", "--gpu-name=sm_90a", src, "-o", f"{tmp}/k.cubin"],
                             capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers(?:, used (\d+) barriers)?", out)
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", out))
    why = next((line.strip() for line in out.splitlines() if SERIALIZED in line), "")
    return int(regs.group(1)), spills, int(regs.group(2) or 0), why


def sass_text(cubin):
    """The kernel's SASS, by nvdisasm (next to ptxas)."""
    nvdisasm = os.path.join(os.path.dirname(_ptxas_path()), "nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/k.cubin", "wb") as f:
            f.write(cubin)
        return subprocess.run([nvdisasm, "-c", f"{tmp}/k.cubin"], capture_output=True, text=True, check=True).stdout


def ptxas_version():
    """``ptxas --version``'s release line for the ptxas Triton uses here for sm_90, and its path."""
    path = _ptxas_path()
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    release = [line for line in out.splitlines() if "release" in line]
    return f"{release[0].strip() if release else 'unknown'} ({path})"


# opcode prefixes that say what a build kept: products, staging stores, reductions, proxy fences, TMA
SASS_OPS = ("HGMMA", "STS.128", "REDG", "FENCE.VIEW.ASYNC", "UTMALDG", "UTMAREDG")


def sass_counts(sass, ops=SASS_OPS):
    """Count of the SASS instructions whose opcode starts with each prefix in ``ops``."""
    seen = sass_opcodes(sass)
    return {op: sum(n for o, n in seen.items() if o.startswith(op)) for op in ops}


def print_compiled_sass(fns, ops=SASS_OPS):
    """Print the ptxas version, then for each kernel the JIT functions ``fns`` have compiled in this
    process its name, its cache key's hash and ``sass_counts`` of the cubin that ran: a diagnostic
    build's record of what the compiler kept, read on the machine that ran it."""
    print(f"sass ({ptxas_version()}):")
    for fn in fns:
        for cache in fn.device_caches.values():
            for kernel in cache[0].values():
                counts = sass_counts(sass_text(kernel.asm["cubin"]), ops)
                print(f"  {kernel.metadata.name} {kernel.hash[:10]} " + " ".join(f"{op}={n}" for op, n in counts.items()))


def sass_top_register(cubin, sass=None):
    """The highest general register (Rn) the kernel's SASS names + 1: in a warp-specialised kernel,
    where ptxas -v reports the launch budget, the widest partition's use (the workers' setmaxnreg cap
    is far below it). ``sass``: the text, if already disassembled."""
    return max(int(n) for n in re.findall(r"\bR(\d+)\b", sass or sass_text(cubin))) + 1


def checked_build(kernel, where):
    """A Gluon build's common checks, within shared memory and ptxas not serialising its wgmmas
    (``where`` names it in a failure), and its figures: (``ptx_counts``, registers, spilled bytes,
    spill instructions inside the consumers' loop, ``spills_between_mmas``)."""
    ptx = kernel.asm["ptx"]
    assert kernel.metadata.shared <= H200_SHARED_BYTES, (where, kernel.metadata.shared)
    nregs, spills, _, serialized = ptxas_report(ptx)
    assert not serialized, (where, serialized)
    return ptx_counts(ptx), nregs, spills, spills_between_mmas(sass_text(kernel.asm["cubin"]))


def spills_between_mmas(sass):
    """Local-memory spill instructions (STL / LDL) between a partition's first and last wgmma (HGMMA)
    in the SASS listing: in a warp-specialised kernel, the consumers' main loop. Spills before or
    after it (a value saved across the loop) cost once a program. Partitions are the stretches
    between register reallocations (USETMAXREG), so two consumer partitions (the backward's
    ``WS_WG_PARTITIONS``) are two loops, not one span from the first one's start to the second's end."""
    total, part = 0, []
    for line in sass.splitlines() + ["USETMAXREG"]:
        if "USETMAXREG" in line:
            mma = [i for i, x in enumerate(part) if "HGMMA" in x]
            if mma:
                total += sum(1 for x in part[mma[0]:mma[-1] + 1] if re.search(r"\b(STL|LDL)\b", x))
            part = []
        else:
            part.append(line)
    return total


def sass_opcodes(sass):
    """SASS instructions by opcode (with its modifiers, e.g. MUFU.EX2), predicated or not."""
    return collections.Counter(re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass, re.M))


def sass_chain(sass, op):
    """The longest run of ``op`` instructions (e.g. FMNMX) in program order in which each one reads
    the register the one before it wrote: a dependent chain such as a sequential row reduction
    (other instructions between them do not break a run)."""
    best = cur = 0
    prev = None
    for m in re.finditer(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?" + op + r"(?:\.\S+)?\s+(R\d+),\s*([^;]*);",
                         sass, re.M):
        dst, srcs = m.group(1), m.group(2)
        cur = cur + 1 if prev is not None and re.search(r"\b" + prev + r"\b", srcs) else 1
        best, prev = max(best, cur), dst
    return best


def sass_branched(sass, op="FMUL", least=16):
    """Innermost regions between a BSSY and its BSYNC (code some threads of a warp may branch over)
    made of ``op`` instructions (at least ``least`` of them, and 80 % of the region's instructions):
    e.g. the conditional rescale's multiplies, not a warp-specialised partition's whole body."""
    ins = r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?"
    n = 0
    for m in re.finditer(r"BSSY\s+(B\d+)", sass):
        end = re.compile(r"BSYNC\s+" + m.group(1) + r"\b").search(sass, m.end())
        region = sass[m.end():end.start()] if end else ""
        ops = len(re.findall(ins + op + r"\b", region, re.M))
        n += "BSSY" not in region and ops >= least and ops >= 0.8 * len(re.findall(ins + r"[A-Z]", region, re.M))
    return n


def run_jobs(check, jobs, workers):
    """Print ``check(job)`` for every job, in order; compiles in ``workers`` forked processes (no GPU,
    no CUDA context to inherit)."""
    if workers > 1:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as ex:
            for line in ex.map(check, jobs):
                print(line, flush=True)
    else:
        for job in jobs:
            print(check(job), flush=True)
