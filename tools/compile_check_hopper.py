"""Compile the Gluon Hopper forward for sm_90 without a GPU (as compile_check.py does for the Triton
kernels): every variant (``ioattn.plan.hopper.VARIANTS``: base, pingpong, split, wg3) x head dim x dtype x mask
the dispatch can pick, at ``ioattn.plan.hopper.kernel_config`` (the launcher's own configuration).

Per kernel it prints shared memory, the registers ptxas reports (the launch budget; the partitions'
own budgets are the setmaxnreg values) and spills, and counts in the PTX of wgmma (and its
commit/wait groups), TMA (cp.async.bulk.tensor), setmaxnreg (with the values), mbarrier operations
(init with their arrival counts, arrive, arrive.expect_tx, try_wait) and named barriers (bar.sync /
bar.arrive per "id/threads"; ``barrier.sync 1`` is the warp-specialisation handshake). The ping-pong
structure shows as NUM_WG consumer partitions (2; 3 for "wg3") with their own named barrier (NUM_WG
ids at 128 threads), mbarrier.init with count NUM_WG (K/V slots released by every warpgroup), the
turn arrives, and setmaxnreg to the consumers' budget (240 for two, 160 for three, and 168 for
wg3's default partition: Triton's leftover).

``--varlen`` compiles the packed-batch specialisation (``IS_VARLEN=True``: cu_seqlens pointers, per-sequence
lengths) instead of the fixed-length kernels (``IS_VARLEN=False``, cu_seqlens constexpr None, as the
launcher passes them); its lines carry ``varlen``.

``--window`` compiles the sliding-window form (``WINDOW=True``, masked key tiles, non-causal) of the
variants that have it (``ioattn.plan.hopper.WINDOW_VARIANTS``); with ``--varlen`` both together. Its lines
carry ``window``. ``--softcap`` likewise the softcap form (``SOFTCAP=True``, ``SOFTCAP_VARIANTS``;
with ``--window`` both); its lines carry ``softcap``. ``--alibi`` likewise the ALiBi form (``ALIBI`` =
``hopper.alibi_form``'s for the mask, the variants that have that form; with the others too); its lines carry ``alibi``.

It also runs ptxas -v on the PTX (skip with --no-ptxas) and flags C7514 ("wgmma.mma_async
instructions are serialized"): the ping-pong variants must compile without it. ``top_reg``: the
highest register the SASS names + 1 (the widest partition's use; ptxas -v reports the launch budget);
MUFU.EX2 and FFMA: those instructions in the SASS; ``tma_stores``: the PTX's bulk tensor copies
to global memory; ``int_div``: the SASS's run-time integer divisions (their I2F.RP).

``--exp2-fma 0,25,50`` compiles each kernel once per share of the exponentials on the FMA units
(``ioattn.plan.hopper.exp2_fma``, the kernel's ``EXP2_FMA``; 0, the default, is the kernel as launched
without the option); its lines carry ``exp2_fma=N%``.
Spills are asserted against the default bounds at 0 only, and reported for the other shares.

    python tools/compile_check_hopper.py [--variants base,pingpong,split,wg3] [--no-ptxas] [--quick] [--jobs N]
        [--masks 0,1] [--headdims 64,128] [--varlen] [--window] [--exp2-fma 0,25,50] [--block-n 64] [--stages 4]
        [--tma-store on|off] [--fast-div on|off] [--ptx-barriers on|off] [--walk-table on|off]

``--tma-store on|off`` / ``--fast-div on|off`` compile the persistent kernel with or without its output
copied by TMA from the Q buffer (``ROW_STORES`` = 3) / its tile index by multiply-high (``FAST_DIV``);
both on by default.

``--ptx-barriers on|off`` compiles the Gluon kernels with or without the pass that drops the consumers'
redundant partition barriers from the PTX (``hopper.ptx_barriers``, on by default; its builds are
checked to have nothing left for the pass to drop).

``--walk-table on|off`` compiles the persistent causal kernels with or without their walk read from a
host-built table (``Walk``, ``hopper.walk_table``; by default where ``hopper.WALK_TABLE_MIN_BLOCKS`` has
the head dim, here at any length it covers).

``--block-n`` / ``--stages`` replace the key tile and the K / V ring depth of every selected variant
(``hopper.TILE_TABLE``), for tile candidates before a device A/B (``ab_fwd.py``'s ``-nBN-sS`` suffix).
"""
import argparse
import os
import re
import sys
import time

from triton.experimental.gluon import language as gl

from ioattn.plan import hopper
from ioattn.kernels import ptx_barriers
from ioattn.kernels.hopper_forward import hopper_fwd_kernel as fn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_aot import (DTYPES, H200_SHARED_BYTES, checked_build, compile_sm90, ptx_counts, ptxas_report,  # noqa: E402
                       run_jobs, sass_branched, sass_chain, sass_opcodes, sass_text, sass_top_register)


WINDOW_FORM = False  # --window (set before the compile jobs' processes are forked: they inherit it)
SOFTCAP_FORM = False  # --softcap (likewise)
ALIBI_FORM = False  # --alibi (likewise)
TRACE = False  # --trace (likewise): the schedule record (``Trace``), the one-tile ping-pong variants
# no score or mask function, no block mask: as the launcher compiles every other call
NO_MODS = dict(mods=None, blocks=None, SCORE_MOD=None, MASK_MOD=None, SUB=1, Q_BLOCK=0, LONGEST_FIRST=False)
IO_DIM = 0  # --io-dim (likewise): the tensors' head dim below the kernel's, through 3-D / 4-D descriptors


def compile_one(variant, d, dt, causal, varlen=False, kv_tail=None, exp2_fma=0, row_stores=True,
                q_prefetch=None, paired=None):
    alibi = hopper.alibi_form(d, causal, WINDOW_FORM, varlen, softcap=SOFTCAP_FORM) if ALIBI_FORM else 0
    cfg = hopper.kernel_config(d, variant, causal, alibi=alibi)
    bn, q_rows = cfg["block_n"], cfg["q_rows"]
    q_layout = gl.NVMMASharedLayout.get_default_for([q_rows, d], DTYPES[dt])
    o_layout = gl.NVMMASharedLayout.get_default_for([1, q_rows, d], DTYPES[dt])
    kv_layout = gl.NVMMASharedLayout.get_default_for([bn, d], DTYPES[dt])
    sig = {n: "i32" for n in fn.arg_names}
    sig.update(q_desc=f"tensordesc<{dt}[{q_rows},{d}],{q_layout!r}>",
               k_desc=f"tensordesc<{dt}[{bn},{d}],{kv_layout!r}>",
               v_desc=f"tensordesc<{dt}[{bn},{d}],{kv_layout!r}>", Out=f"*{dt}", Lse="*fp32", qk_scale="fp32",
               softcap_a="fp32", alibi_unit="fp32")
    ring = bool(IO_DIM) and hopper.split_ring_for(d, IO_DIM, variant, cfg_tail(varlen, kv_tail))  # the launcher's
    if IO_DIM:  # the launcher's head-padded descriptors (gluon_fwd.padded_rows_desc): one rank more, a unit box
        for name, rows, cols in (("q_desc", q_rows, d), ("k_desc", bn, 128 if ring else d),
                                 ("v_desc", bn, 128 if ring else d)) + ((("k_hi_desc", bn, 64),
                                                                        ("v_hi_desc", bn, 64)) if ring else ()):
            lay = gl.NVMMASharedLayout.get_default_for([1, rows, cols], DTYPES[dt])
            sig[name] = f"tensordesc<{dt}[1,{rows},{cols}],{lay!r}>"
        o_layout = gl.NVMMASharedLayout.get_default_for([1, 1, q_rows, d], DTYPES[dt])
    # KV_TAIL as the launcher sets it for varlen; fixed length: off unless asked (lengths that are
    # multiples of the key tile)
    constexprs = dict(cfg["constexprs"], IS_CAUSAL=causal, IS_VARLEN=varlen, LPT=False,
                      KV_TAIL=varlen if kv_tail is None else kv_tail, EXP2_FMA=hopper.exp2_fma_cols(exp2_fma, bn),
                      ROW_STORES=cfg_row_stores(row_stores, variant, d),
                      **cfg_persistent(q_prefetch, paired, variant, d, causal))
    constexprs.update(KEY_MASKS=WINDOW_FORM or hopper.key_masks(d, variant, causal, constexprs["KV_TAIL"]),
                      DIAG_TRIM=hopper.diag_trim_for(d, variant, causal), WINDOW=WINDOW_FORM, SOFTCAP=SOFTCAP_FORM,
                      ALIBI=alibi, IO_DIM=IO_DIM, PROD_DIM=hopper.split_cols_for(d, IO_DIM, variant))
    # the launcher's: the split products read Q from shared memory
    constexprs.update(Q_IN_REGS=hopper.split_cols_q_in_regs(constexprs["Q_IN_REGS"], constexprs["PROD_DIM"]))
    constexprs.update(NO_MODS, FP8_BLOCKS=False)
    if ring:
        constexprs.update(STAGES=hopper.SPLIT_RING_STAGES)
        cfg["stages"] = hopper.SPLIT_RING_STAGES
    else:  # the launcher passes None
        constexprs.update(k_hi_desc=None, v_hi_desc=None)
    if TRACE:  # the schedule record (else the launcher passes None)
        sig.update(Trace="*i64")
    else:
        constexprs.update(Trace=None)
    if ALIBI_FORM:  # the slopes (else the launcher passes None)
        sig.update(Alibi="*fp32")
    else:
        constexprs.update(Alibi=None)
    if constexprs["ROW_STORES"] == 3:  # the output's bulk copies (else the launcher passes None)
        o_box = f"1,1,{q_rows},{d}" if IO_DIM else f"1,{q_rows},{d}"
        sig.update(o_desc=f"tensordesc<{dt}[{o_box}],{o_layout!r}>")
    else:
        constexprs.update(o_desc=None)
    if not varlen and cfg_walk_table(paired, variant, d, causal):  # the walk read from a host table
        sig.update(Walk="*i32")
    else:  # the launcher passes None: constexpr None
        constexprs.update(Walk=None)
    if varlen:
        sig.update(Cu_q="*i32", Cu_k="*i32")
    else:  # the launcher passes None for fixed-length calls: constexpr None
        constexprs.update(Cu_q=None, Cu_k=None)
    # the output pointer and its row stride (nheads * d) divisible by 16 as at run time, so the
    # epilogue's vector stores show in the SASS
    return cfg, compile_sm90(fn, sig, constexprs, cfg["num_warps"], aligned=("Out", "stride_om"))




def compile_fp8(d, causal, varlen=False, blocks=False):
    """The FP8 forward as the launcher builds it (``plan.forward._make_fp8``'s constexprs, e4m3 Q / K
    descriptors, V^T's [d, block_n] one, the descales' pointer; ``varlen``: packed sequences; ``blocks``:
    Q's and K's descales per block of rows); returns its report line."""
    from ioattn.plan import forward as forward_plan

    sig = forward_plan.Signature(batch=1, seqlen_q=4096, seqlen_k=4096, nheads=1, nheads_kv=1, head_dim=d,
                                 element_size=1, varlen=varlen, causal=causal, window=(-1, -1), softcap=0.0,
                                 softmax_scale=d ** -0.5, alibi=False, device_sms=132, fp8_blocks=blocks)
    plan = forward_plan.plan_forward(sig)
    f8 = gl.float8e4nv
    lay = {name: gl.NVMMASharedLayout.get_default_for(list(box), f8)
           for name, box in (("q", (plan.q_rows, d)), ("k", (plan.block_n, d)), ("v", (d, plan.block_n)))}
    sig_types = {n: "i32" for n in fn.arg_names}
    sig_types.update(q_desc=f"tensordesc<fp8e4nv[{plan.q_rows},{d}],{lay['q']!r}>",
                     k_desc=f"tensordesc<fp8e4nv[{plan.block_n},{d}],{lay['k']!r}>",
                     v_desc=f"tensordesc<fp8e4nv[{d},{plan.block_n}],{lay['v']!r}>", Out="*bf16", Lse="*fp32",
                     qk_scale="fp32", softcap_a="fp32", alibi_unit="fp32", Descales="*fp32")
    constexprs = dict(plan.constexprs, k_hi_desc=None, v_hi_desc=None, Alibi=None, o_desc=None, Walk=None,
                      **NO_MODS)
    constexprs.setdefault("FP8_BLOCKS", False)
    if TRACE and not varlen:  # the schedule record (``bench pingpong-trace --fp8``)
        sig_types.update(Trace="*i64")
    else:
        constexprs.update(Trace=None)
    if varlen:
        sig_types.update(Cu_q="*i32", Cu_k="*i32")
    else:
        constexprs.update(Cu_q=None, Cu_k=None)
    k = compile_sm90(fn, sig_types, constexprs, plan.num_warps, aligned=("Out", "stride_om"))
    ptx = k.asm["ptx"]
    c = ptx_counts(ptx)
    assert k.metadata.shared <= H200_SHARED_BYTES, (d, causal, k.metadata.shared)
    assert "e4m3.e4m3" in ptx and c["tma"], (d, causal, c)  # 8-bit wgmma, TMA loads
    nregs, spills, _, serialized = ptxas_report(ptx)
    assert not serialized, (d, causal, serialized)
    sass = sass_text(k.asm["cubin"])
    return (f"fp8{' blocks' if blocks else ''} pingpong d={d} causal={causal}{' varlen' if varlen else ''} tiles={plan.block_m}x{plan.block_n} shared={k.metadata.shared} "
            f"regs={nregs} spills={spills} chains[FMNMX={sass_chain(sass, 'FMNMX')},FADD={sass_chain(sass, 'FADD')}] "
            f"{fmt(c)}")


def _user_causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def compile_mods(d, kv_tail=False, captures=True):
    """The forward with a score function capturing a learnable table, a mask function capturing document
    ids and a block mask (``plan.forward.plan_forward_mods``; the functions and the run-time tuples as the
    launch binds them, ``ModCall.functions`` / ``gluon_forward_args``); ``captures`` False: instead a
    causal mask function capturing nothing, at the tiles the plan gives it (``plan.mods.tiles``);
    returns its report line."""
    import torch

    from ioattn import backends, mods
    from ioattn.block_mask import create_block_mask
    from ioattn.modcall import ModCall
    from ioattn.plan import forward as forward_plan

    n = 1024 + (32 if kv_tail else 0)  # past a multiple of 64 keys too: a key tail at every tile width
    if captures:
        call = ModCall.make(mods.relative_bias(torch.zeros(4, 9, requires_grad=True)), None,
                            create_block_mask(mods.document_mask(torch.zeros(n, dtype=torch.int32),
                                                                 mods.causal_mask), None, None, n, n, BLOCK_SIZE=128))
    else:
        call = ModCall.make(None, None, create_block_mask(_user_causal, None, None, n, n, BLOCK_SIZE=128))
    sig = forward_plan.Signature(batch=1, seqlen_q=n, seqlen_k=n, nheads=4, nheads_kv=4, head_dim=d,
                                 element_size=2, varlen=False, causal=False, window=(-1, -1), softcap=0.0,
                                 softmax_scale=d ** -0.5, alibi=False, device_sms=132)
    backends.clear_routes()
    plan = forward_plan.plan_forward_mods(sig, call.score is not None, call.block_size(), call.captures(),
                                          call.exact_lists())
    bn, q_rows = plan.block_n, plan.q_rows
    lay = {name: gl.NVMMASharedLayout.get_default_for(list(box), gl.bfloat16)
           for name, box in (("q", (q_rows, d)), ("kv", (bn, d)))}
    types = {n: "i32" for n in fn.arg_names}
    types.update(q_desc=f"tensordesc<bf16[{q_rows},{d}],{lay['q']!r}>", k_desc=f"tensordesc<bf16[{bn},{d}],{lay['kv']!r}>",
                 v_desc=f"tensordesc<bf16[{bn},{d}],{lay['kv']!r}>", Out="*bf16", Lse="*fp32", qk_scale="fp32",
                 softcap_a="fp32", alibi_unit="fp32")
    mod_args, blocks = call.gluon_forward_args(sig.softmax_scale, dict(plan.constexprs)["Q_BLOCK"])
    types.update(mods=_jit_type(mod_args), blocks=_jit_type(blocks))
    constexprs = dict(plan.constexprs, **call.functions(), k_hi_desc=None, v_hi_desc=None, Alibi=None, o_desc=None,
                      Walk=None, Cu_q=None, Cu_k=None, Trace=None, Descales=None)
    constexprs.setdefault("FP8_BLOCKS", False)
    k = compile_sm90(fn, types, constexprs, plan.num_warps, aligned=("Out", "stride_om"))
    c, nregs, spills, in_loop = checked_build(k, d)
    return (f"mods pingpong{'' if captures else ' no-captures'} d={d} Q_BLOCK={constexprs['Q_BLOCK']} kv_tail={kv_tail} tiles={plan.block_m}x{bn} "
            f"SUB={constexprs['SUB']} "
            f"shared={k.metadata.shared} regs={nregs} spills={spills} loop_spills={in_loop} {fmt(c)}")


def _jit_type(value):
    """The signature type the JIT gives a launch argument: a tensor's pointer, an int, a float, a tuple."""
    import torch

    if isinstance(value, tuple):
        return tuple(_jit_type(v) for v in value)
    if isinstance(value, torch.Tensor):
        return "*" + {torch.float32: "fp32", torch.int32: "i32", torch.int64: "i64"}[value.dtype]
    return "fp32" if isinstance(value, float) else "i32"


def fmt(c):
    nreg = " ".join(f"{op}{v}x{n}" for (op, v), n in sorted(c["setmaxnreg"].items(),
                                                             key=lambda t: (t[0][0], int(t[0][1]))))
    init = ",".join(f"c{cnt}x{n}" for cnt, n in sorted(c["mb_init"].items()))
    bars = " ".join(f"{b}:{n}" for b, n in sorted(c["bars"].items()))
    waits = ",".join(f"w{k}x{n}" for k, n in sorted(c["waits"].items()))
    return (f"wgmma={c['wgmma']} (commit {c['commit']}, {waits}) tma={c['tma']} "
            f"setmaxnreg={sum(c['setmaxnreg'].values())} [{nreg}] "
            f"mbarrier(init={sum(c['mb_init'].values())} [{init}] arrive={c['mb_arrive']} expect_tx={c['mb_expect']} "
            f"try_wait={c['mb_wait']}) named[{bars}]")


def cfg_tail(varlen, kv_tail):
    """KV_TAIL as compile_one sets it."""
    return varlen if kv_tail is None else kv_tail


def cfg_row_stores(row_stores, variant, d):
    """The kernel's ``ROW_STORES`` as the launcher sets it (``hopper.row_stores``), under
    ``--no-row-stores``."""
    with hopper.out_row_stores(row_stores):
        return hopper.row_stores(d, variant)


def cfg_persistent(q_prefetch, paired, variant, d, causal):
    """The kernel's ``Q_BUFS`` / ``PAIRED`` as the launcher sets them (``hopper.persistent_options``, an
    even number of query blocks): its defaults, or forced on by ``--q-prefetch`` / ``--paired``."""
    with hopper.persistent_q_prefetch(q_prefetch), hopper.paired_walk(paired):
        return hopper.persistent_options(d, variant, causal, 2)


def cfg_walk_table(paired, variant, d, causal):
    """Whether the launcher passes the host's walk table (``hopper.walk_table_for`` at any length it
    covers), under ``--paired`` as ``cfg_persistent`` sets it."""
    with hopper.paired_walk(paired):
        return hopper.walk_table_for(d, variant, causal)


def check(job):
    """Compile one (variant, head dim, dtype, causal), assert its structure, return its report line."""
    variant, d, dt, causal, run_ptxas, varlen, kv_tail, exp2_fma, row_stores, q_prefetch, paired = job
    cfg, k = compile_one(variant, d, dt, causal, varlen, kv_tail, exp2_fma, row_stores, q_prefetch, paired)
    opts = cfg_persistent(q_prefetch, paired, variant, d, causal)
    ptx = k.asm["ptx"]
    c = ptx_counts(ptx)
    where = (variant, d, dt, causal, varlen)
    assert k.metadata.shared <= H200_SHARED_BYTES, (where, k.metadata.shared)
    if cfg["constexprs"]["PTX_BARRIERS"]:  # the pass ran on this build: nothing left to drop
        assert ptx_barriers.MARKER in ptx, where
        left = ptx_barriers.drop_partition_barriers(ptx)[1]
        assert left["wait"] == left["arrive"] == 0, (where, left)
    assert c["wgmma"] and c["tma"] and c["setmaxnreg"], (where, c)
    if variant != "base":  # NUM_WG consumer partitions, each with its own named barrier
        num_wg = cfg["constexprs"]["NUM_WG"]
        consumer_bars = {b for b in c["bars"] if b.startswith("bar.sync") and b.endswith("/128")}
        assert len(consumer_bars) >= num_wg, (where, c["bars"])
        # K/V empties: every warpgroup releases each slot (count NUM_WG, K and V per stage)
        assert c["mb_init"].get(str(num_wg)) == 2 * cfg["stages"], (where, c["mb_init"])
        if num_wg == 3:  # and no barrier of count 2 left over from the two-warpgroup layout
            assert "2" not in c["mb_init"], (where, c["mb_init"])
        # count 1: Q_BUFS Q barriers and a turn barrier per warpgroup, K and V ready barriers per stage,
        # v_tail
        assert c["mb_init"].get("1") == (opts["Q_BUFS"] + 1) * num_wg + 2 * cfg["stages"] + 1, (where, c["mb_init"])
        # the consumers' budget: (65536 / 128 - producer) / NUM_WG rounded down to 8 (240; 160 for
        # three); the producer 24, 32 in the persistent kernel (its tile loop; 240 either way)
        producer = 32 if variant == "persistent" else 24
        regs = (65536 // 128 - producer) // num_wg // 8 * 8
        assert c["setmaxnreg"][("inc", str(regs))] and c["setmaxnreg"][("dec", str(producer))], (where, c["setmaxnreg"])
        if num_wg == 3:  # the default partition gets Triton's leftover: (65536 - producer*128 - 2*160*128) / 128
            leftover = (65536 - producer * 128 - 2 * regs * 128) // 128
            assert c["setmaxnreg"][("dec", str(leftover))], (where, c["setmaxnreg"])
    regs = ""
    if run_ptxas:
        nregs, spills, nbars, serialized = ptxas_report(ptx)
        serialized = bool(serialized)
        sass = sass_text(k.asm["cubin"])
        ops = sass_opcodes(sass)
        regs = (f"regs={nregs} top_reg={sass_top_register(None, sass)} spill={spills}B bars_used={nbars} "
                f"{'SERIALIZED' if serialized else 'wgmma-pipelined'} "
                f"MUFU.EX2={ops['MUFU.EX2']} FFMA={ops['FFMA']} SHFL={sum(n for op, n in ops.items() if op.startswith('SHFL'))} "
                f"chains[FMNMX={sass_chain(sass, 'FMNMX')},FADD={sass_chain(sass, 'FADD')}] "
                f"branched_fmul={sass_branched(sass)} votes={ops['VOTE.ANY']} "
                f"out_stores[{','.join(f'{op}x{n}' for op, n in sorted(ops.items()) if op.startswith('STG'))}] "
                f"tma_stores={len(re.findall(r'cp[.]async[.]bulk[.]tensor[.][1-5]d[.]global[.]shared', ptx))} "
                f"int_div={ops['I2F.RP'] + ops['I2F.U32.RP']} ")
        if variant != "base":
            # persistent: a few per-tile values spill around the tile loop (80 B at d = 128 / 256
            # non-causal, ptxas 12.8: reloaded in the epilogue and the loop's bookkeeping, none in
            # the key loop's SASS); 0 for the others
            # KV_TAIL (varlen, key lengths not a multiple of the tile): with the producer's V-tail
            # zeroing ptxas spills 72-176 B in the three-warpgroup kernel (16 B in "split" at d=256;
            # docs/decisions/gluon-varlen.md); the others stay at 0 (persistent: its 80-116 B of tile-loop values)
            tail = cfg_tail(varlen, kv_tail)
            allowed = 128 if variant == "persistent" else 192 if tail and variant in ("wg3", "split") else 0
            # the window form with packed sequences at d = 64 (its lengths and the window's bounds live
            # across the key loop): 16 B in pingpong / split, 268 B in wg3 (136 B without the window),
            # ptxas 12.8; the default policy sends no d = 64 varlen call there
            if WINDOW_FORM and varlen and d == 64:
                allowed = 288 if variant == "wg3" else 32
            # ALiBi's fp32 columns (docs/decisions/alibi.md) with another form: 8-24 B at d = 256 causal with a softcap or
            # packed, 16 B packed with a window at d = 64 / 128 (ptxas 12.8; measured as the fp32 form's configuration)
            if ALIBI_FORM and hopper.alibi_form(d, causal, WINDOW_FORM, varlen, softcap=SOFTCAP_FORM) == hopper.ALIBI_FP32_COLS and \
                    (SOFTCAP_FORM or varlen):
                allowed = max(allowed, 32)
            assert not serialized, (where, "ptxas serialised the wgmmas")
            assert exp2_fma or spills <= allowed, (where, "ptxas spilled", spills)
    if exp2_fma:
        regs += f"exp2_fma={exp2_fma:g}% "
    mode = cfg_row_stores(row_stores, variant, d)
    if mode:
        regs += {1: "row_stores ", 2: "row_stores_via_q ", 3: "tma_store "}[mode]
    if cfg["constexprs"]["FEWER_MASKS"]:
        regs += "fewer_masks "
    if cfg["constexprs"]["COND_RESCALE"]:
        regs += "cond_rescale_by_warp " if cfg["constexprs"]["RESCALE_BY_WARP"] else "cond_rescale "
    if cfg["constexprs"]["Q_IN_REGS"]:
        regs += "q_in_registers "
    if cfg["constexprs"]["DEFERRED_SUM"]:
        regs += "deferred_row_sum "
    if cfg["constexprs"]["MASK_BRANCH"]:
        regs += "mask_branch "
    if opts["Q_BUFS"] == 2:
        regs += "q_prefetch "
    if opts["PAIRED"]:
        regs += "paired "
    if opts["FAST_DIV"]:
        regs += "fast_div "
    if not WINDOW_FORM and not hopper.key_masks(d, variant, causal, cfg_tail(varlen, kv_tail)):
        regs += "unmasked_keys "
    if hopper.diag_trim_for(d, variant, causal):
        regs += "diag_trim "
    if cfg["constexprs"]["PTX_BARRIERS"]:
        regs += "ptx_barriers "
    if not varlen and cfg_walk_table(paired, variant, d, causal):
        regs += "walk_table "
    return (f"{variant:8s} d={d} {dt} causal={causal!s:5s} {'varlen ' if varlen else ''}"
            f"{'window ' if WINDOW_FORM else ''}{'softcap ' if SOFTCAP_FORM else ''}{'alibi ' if ALIBI_FORM else ''}"
            f"tiles={cfg['block_m']}x{cfg['block_n']}x{cfg['stages']} "
            f"warps={k.metadata.num_warps} shared={k.metadata.shared} {regs}{fmt(c)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(hopper.VARIANTS))
    ap.add_argument("--no-ptxas", action="store_true", help="skip the ptxas -v report (registers, spills, C7514)")
    ap.add_argument("--quick", action="store_true", help="bf16 only (fp16 compiles the same code but the dtype)")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="compiles in parallel")
    ap.add_argument("--masks", default="0,1", help="0 (non-causal), 1 (causal) or both")
    ap.add_argument("--headdims", default=None, help="comma-separated subset of each variant's head dims")
    ap.add_argument("--varlen", action="store_true", help="the packed-batch kernels (IS_VARLEN=True)")
    ap.add_argument("--window", action="store_true",
                    help="the sliding-window form (WINDOW=True; non-causal, hopper.WINDOW_VARIANTS only)")
    ap.add_argument("--softcap", action="store_true",
                    help="the softcap form (SOFTCAP=True; hopper.SOFTCAP_VARIANTS only)")
    ap.add_argument("--alibi", action="store_true",
                    help="the ALiBi form (ALIBI=hopper.alibi_form(...); the variants with that form)")
    ap.add_argument("--io-dim", type=int, default=0,
                    help="the tensors' head dim below the kernel's (IO_DIM, gluon_fwd.padded_rows_desc's 3-D / 4-D "
                         "descriptors; a multiple of 8): the head-padded kernels without copies")
    ap.add_argument("--split-ring", default="default", choices=("default", "on", "off"),
                    help="with the products over 192 columns: the K / V ring in 128 + 64-column buffers, "
                         "three stages (hopper.split_ring)")
    ap.add_argument("--split-cols", default="default", choices=("default", "on", "off"),
                    help="with --io-dim 136-192 at d = 256: the products over 192 columns (PROD_DIM, "
                         "hopper.split_cols) or all 256")
    ap.add_argument("--trace", action="store_true",
                    help="with the schedule record (Trace: clock stamps per warpgroup and critical section)")
    ap.add_argument("--kv-tail", action="store_true",
                    help="fixed-length kernels for key lengths not a multiple of the key tile (KV_TAIL=True)")
    ap.add_argument("--no-row-stores", action="store_true",
                    help="the output stored from the accumulator layout (ROW_STORES off, hopper.out_row_stores) "
                         "where the launcher stores whole rows")
    ap.add_argument("--q-prefetch", action="store_true",
                    help="persistent: two Q buffers per consumer warpgroup wherever they fit (Q_BUFS=2, "
                         "hopper.persistent_q_prefetch forced on; default: the launcher's table)")
    ap.add_argument("--paired", action="store_true",
                    help="persistent, causal: the walk by pairs of query blocks at every head dim (PAIRED, "
                         "hopper.paired_walk forced on; default: the launcher's table)")
    ap.add_argument("--exp2-fma", default="0",
                    help="comma-separated shares (%%) of the exponentials on the FMA units (EXP2_FMA): "
                         f"{', '.join(f'{x:g}' for x in hopper.EXP2_FMA_SHARES)}")
    ap.add_argument("--cond-rescale", default="default", choices=("default", "off", "thread", "warp"),
                    help="FA4's conditional rescaling (COND_RESCALE, hopper.conditional_rescale_for): the policy's, "
                         "off, or on everywhere decided by the thread or by the warp (RESCALE_BY_WARP, "
                         "hopper.rescale_by_warp)")
    ap.add_argument("--deferred-row-sum", default="default", choices=("default", "on", "off"),
                    help="the row sum's quad reduction once a tile (DEFERRED_SUM, hopper.deferred_row_sum_for): "
                         "the policy's, on wherever it fits, or off")
    ap.add_argument("--mask-branch", default="default", choices=("default", "on", "off"),
                    help="a tile's first-step mask under its own branch ahead of one softmax body (MASK_BRANCH, "
                         "hopper.mask_branch): the policy's, on in every lean kernel, or off")
    ap.add_argument("--tma-store", default="default", choices=("default", "on", "off"),
                    help="persistent: the output copied by TMA from the Q buffer (ROW_STORES=3, hopper.out_tma_store)")
    ap.add_argument("--fast-div", default="default", choices=("default", "on", "off"),
                    help="persistent: the tile index by multiply-high (FAST_DIV, hopper.fast_tile_div)")
    ap.add_argument("--unmasked-keys", default="default", choices=("default", "on", "off"),
                    help="non-causal fixed-length kernels (no KV_TAIL): no key tile masked (KEY_MASKS=False, "
                         "hopper.unmasked_full_keys)")
    ap.add_argument("--diag-trim", default="default", choices=("default", "on", "off"),
                    help="persistent, causal: warpgroup 0's key tiles past its rows' diagonal skipped (DIAG_TRIM, "
                         "hopper.diag_trim)")
    ap.add_argument("--ptx-barriers", default="default", choices=("default", "on", "off"),
                    help="the consumers' redundant partition barriers dropped from the PTX or kept "
                         "(hopper.ptx_barriers)")
    ap.add_argument("--walk-table", default="default", choices=("default", "on", "off"),
                    help="persistent, causal: the walk read from a host-built table (Walk, hopper.walk_table)")
    ap.add_argument("--block-n", type=int, default=None,
                    help="key tile (block_n) of every selected variant and head dim instead of hopper.TILE_TABLE's")
    ap.add_argument("--stages", type=int, default=None, help="K / V ring depth instead of hopper.TILE_TABLE's")
    ap.add_argument("--fp8", action="store_true", help="the FP8 (e4m3) forward's builds instead (hopper.FP8_TILES)")
    ap.add_argument("--fp8-blocks", action="store_true", help="with --fp8: Q's and K's descales per block of rows")
    ap.add_argument("--no-captures", action="store_true",
                    help="with --mods: a causal mask function capturing nothing instead (its own tiles)")
    ap.add_argument("--mods", action="store_true",
                    help="the forward with score and mask functions and a block mask (plan_forward_mods) instead")
    args = ap.parse_args()
    if args.trace:  # before the compile jobs' processes are forked (they inherit it); FP8's builds too
        global TRACE
        TRACE = True
        args.variants = ",".join(v for v in args.variants.split(",") if v in ("pingpong", "wg3", "split"))
    if args.mods:  # the programmable forward's builds alone
        for d in map(int, (args.headdims or "64,128,256").split(",")):
            for kv_tail in (False, True):
                print(compile_mods(d, kv_tail, not args.no_captures), flush=True)
        return
    if args.fp8:  # the FP8 forward's builds alone
        for d in map(int, (args.headdims or ",".join(map(str, hopper.FP8_TILES))).split(",")):
            for causal in (m == "1" for m in args.masks.split(",")):
                print(compile_fp8(d, causal, args.varlen, args.fp8_blocks), flush=True)
        return
    if args.window:  # before the compile jobs' processes are forked (they inherit it)
        global WINDOW_FORM
        WINDOW_FORM = True
        args.masks = "0"
        args.variants = ",".join(v for v in args.variants.split(",") if v in hopper.WINDOW_VARIANTS)
    if args.softcap:  # likewise
        global SOFTCAP_FORM
        SOFTCAP_FORM = True
        args.variants = ",".join(v for v in args.variants.split(",") if v in hopper.SOFTCAP_VARIANTS)
    if args.alibi:  # likewise
        global ALIBI_FORM
        ALIBI_FORM = True
        args.variants = ",".join(v for v in args.variants.split(",") if v in hopper.ALIBI_VARIANTS)
    if args.io_dim:  # likewise
        global IO_DIM
        IO_DIM = args.io_dim
    if args.block_n or args.stages:  # before the compile jobs' processes are forked (they inherit it)
        for variant in args.variants.split(","):
            for d, (bm, bn, st) in list(hopper.TILE_TABLE[variant].items()):
                hopper.TILE_TABLE[variant][d] = (bm, args.block_n or bn, args.stages or st)
    if args.tma_store != "default":  # before the compile jobs' processes are forked (they inherit it)
        hopper.out_tma_store.value = args.tma_store == "on"
    if args.fast_div != "default":  # likewise
        hopper.fast_tile_div.value = args.fast_div == "on"
    if args.unmasked_keys != "default":  # likewise
        hopper.unmasked_full_keys.value = args.unmasked_keys == "on"
    if args.diag_trim != "default":  # likewise
        hopper.diag_trim.value = args.diag_trim == "on"
    if args.ptx_barriers != "default":  # likewise
        hopper.ptx_barriers.value = args.ptx_barriers == "on"
    if args.walk_table != "default":  # likewise
        hopper.walk_table.value = args.walk_table == "on"
    if args.split_cols != "default":  # likewise
        hopper.split_cols.value = args.split_cols == "on"
    if args.split_ring != "default":  # likewise
        hopper.split_ring.value = args.split_ring == "on"
    if args.deferred_row_sum != "default":  # before the compile jobs' processes are forked (they inherit it)
        hopper.deferred_row_sum.value = args.deferred_row_sum == "on"
    if args.mask_branch != "default":  # likewise
        hopper.mask_branch.value = args.mask_branch == "on"
    if args.cond_rescale != "default":  # set before the compile jobs' processes are forked (they inherit it)
        hopper.conditional_rescale.value = args.cond_rescale != "off"
        hopper.rescale_by_warp.value = args.cond_rescale == "warp"
    dtypes = ("bf16",) if args.quick else ("bf16", "fp16")
    masks = [bool(int(m)) for m in args.masks.split(",")]
    dims = None if args.headdims is None else {int(x) for x in args.headdims.split(",")}
    shares = [float(x) for x in args.exp2_fma.split(",")]
    jobs = [(variant, d, dt, causal, not args.no_ptxas, args.varlen, args.kv_tail or None, share,
             not args.no_row_stores, args.q_prefetch or None, args.paired or None)
            for variant in args.variants.split(",")
            for d in hopper.TILE_TABLE[variant] if dims is None or d in dims for dt in dtypes for causal in masks
            for share in shares
            # ALiBi: the variants of the call's form (wg3 has the magic-number form only)
            if not ALIBI_FORM or hopper.alibi_form(d, causal, WINDOW_FORM, args.varlen, softcap=SOFTCAP_FORM) == hopper.ALIBI_MAGIC
            or variant in hopper.ALIBI_FP32_VARIANTS]
    t0 = time.time()
    run_jobs(check, jobs, args.jobs)
    print(f"hopper kernel compiled for sm_90: {len(jobs)} {'varlen ' if args.varlen else ''}kernels, "
          f"variants {args.variants} "
          f"({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
