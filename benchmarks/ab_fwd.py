"""A/B of forward variants in one process, with SDPA's flash and cuDNN backends timed beside them:
the K/V load path (pointer / TMA descriptors) crossed with the tiles given in ``--tiles``.
(At commit e72b253 it also crossed the exp2 mode of FlashAttention-4's polynomial in the portable
kernel; that variant was measured slower everywhere and removed. The Gluon forward's own version is
the ``-fmaNN`` suffix below; both: docs/decisions/exp2-emulation.md.)

    python benchmarks/ab_fwd.py --out DIR [--headdims 64,128] [--seqlens 1024,4096,16384]

bf16, 16384 tokens, hidden 2048 (the bench's grid). Every variant is checked against the float64
oracle (``ioattn.bench.run._check``) on the first sequence length of each (head dim, mask) before
it is timed; timing is ``ioattn.bench.timing.median_ms`` (device time, median of 20), in ``--rounds``
interleaved rounds (the median of their medians).
"""
import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import time

import torch

import ioattn
from ioattn.plan import dispatch, hopper
from ioattn.bench.providers import providers
from ioattn.bench.run import _check
from ioattn.bench.timing import attention_flops, median_ms

@contextlib.contextmanager
def gluon_tiles(name, d, block_n, stages):
    """``hopper.TILE_TABLE[name][d]`` with this key tile and ring depth inside the block (the "-nBN-sS"
    suffix; a head dim the variant lacks gets 64 query rows a consumer warpgroup), restored after; for
    the persistent kernel also without its short causal tiles (``hopper.SHORT_CAUSAL_TILES``), so that
    the suffix names the tiles at every length."""
    table = hopper.TILE_TABLE[name]
    before = table.get(d)
    short = hopper.SHORT_CAUSAL_TILES.pop(d, None) if name == "persistent" else None
    block_m = before[0] if before else 64 * (3 if name == "wg3" else 2)
    table[d] = (block_m, block_n or (before[1] if before else 64), stages or (before[2] if before else 4))
    try:
        yield
    finally:
        if before is None:
            del table[d]
        else:
            table[d] = before
        if short is not None:
            hopper.SHORT_CAUSAL_TILES[d] = short


def variant_fn(tma, gluon, tau, tiles, exp2_fma=0.0, lean=False, acc_stores=False,
               q_prefetch=None, paired=None, cond_rescale=None, gtiles=None, q_regs=False, deferred_sum=False,
               mask_branch=None, tma_store=None, fast_div=None, unmasked=None, diag_trim=None, ptx_bars=None,
               walk_tab=None, walk_cost=None, walk_mb=None):
    def run(q, k, v, causal):
        with contextlib.ExitStack() as stack:
            if gluon and gtiles:
                stack.enter_context(gluon_tiles(gluon, q.shape[-1], *gtiles))
            return call(q, k, v, causal)

    def call(q, k, v, causal):
        if gluon and q.shape[-1] not in hopper.TILE_TABLE[gluon]:  # else the portable kernel would be timed
            raise ValueError(f"the Gluon {gluon} variant has no head dim {q.shape[-1]}")
        dispatch.set_tile_override("fwd", tiles)
        try:
            # one ExitStack: the settings outnumber the nested blocks one with-statement may hold
            with contextlib.ExitStack() as stack:
                for setting in (dispatch.prefer_tma(tma),
                                hopper.prefer_hopper(bool(gluon)), hopper.variant(gluon or "base"),
                                dispatch.rescale_threshold(tau), hopper.exp2_fma(exp2_fma),
                                hopper.lean_softmax(lean), hopper.out_row_stores(not acc_stores),
                                hopper.persistent_q_prefetch(q_prefetch), hopper.paired_walk(paired),
                                hopper.conditional_rescale(bool(cond_rescale)),
                                hopper.rescale_by_warp(cond_rescale == "warp"), hopper.q_in_registers(q_regs),
                                hopper.deferred_row_sum(deferred_sum), hopper.mask_branch(mask_branch),
                                hopper.out_tma_store(tma_store),
                                hopper.fast_tile_div(fast_div), hopper.unmasked_full_keys(unmasked),
                                hopper.diag_trim(diag_trim), hopper.ptx_barriers(ptx_bars),
                                hopper.walk_table(None if walk_tab is None else bool(walk_tab))):
                    stack.enter_context(setting)
                if walk_tab == "all":  # the table's walk as one group of heads: its balance without its locality
                    stack.enter_context(_patched(hopper, "WALK_TABLE_L2_BYTES", {d: 1 << 62 for d in hopper.WALK_TABLE_FITS}))
                if walk_cost is not None:  # the table's model: a tile's fixed cost in key tiles
                    stack.enter_context(_patched(hopper, "WALK_TABLE_TILE_COST", float(walk_cost)))
                if walk_mb is not None:  # the table's groups: K / V megabytes a group
                    stack.enter_context(_patched(hopper, "WALK_TABLE_L2_BYTES", {d: walk_mb << 20 for d in hopper.WALK_TABLE_FITS}))
                return ioattn.flash_attn_func(q, k, v, causal=causal)
        finally:
            dispatch.set_tile_override("fwd", None)
    return run


@contextlib.contextmanager
def _patched(module, name, value):
    previous = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, previous)


# "-fmaNN": that share of the exponentials on the FMA units (hopper.exp2_fma); 12 stands for 12.5
FMA_SUFFIX = {"12": 12.5, "25": 25.0, "50": 50.0, "100": 100.0}


def parse_load(name, loads):
    """A --loads name -> (its loads entry, exp2_fma, acc_stores, q_prefetch, paired): a base name,
    then optionally "-fmaNN" (Gluon only), "-accstore" (Gluon only: the output stored from the
    accumulator layout, hopper.out_row_stores off; before whole-row stores became the default "-rows" named the opposite), "-cr"
    or "-crw" (FA4's conditional rescaling, hopper.conditional_rescale, decided by the thread or by the
    warp, hopper.rescale_by_warp; wg3 or a "-lean" name), "-nBN" and / or "-sS" (Gluon only: the key
    tile and K / V ring depth instead of hopper.TILE_TABLE's, ``gluon_tiles``; wg3 at d = 128 too), "-q2"
    or "-noq2" and "-pair" or "-nopair" (the persistent kernel's two Q buffers a warpgroup,
    hopper.persistent_q_prefetch, and causal walk by pairs, hopper.paired_walk, forced on or off;
    without them, the launcher's default), "-qr" (a "-lean" name: Q as S = Q K^T's
    register operand, hopper.q_in_registers; without it, off, whatever the launcher's default) and
    "-ds" (wg3 or a "-lean" name: the row sum's quad reduction deferred, hopper.deferred_row_sum;
    without it, off, whatever the launcher's default) and "-mb" or "-nomb" (wg3 or a "-lean" name: a
    tile's first-step mask under its own branch ahead of one softmax body, hopper.mask_branch, forced
    on or off; without it, the launcher's default, which depends on the mask), and "-tma" / "-fd" (a
    persistent name: the output's bulk copies, hopper.out_tma_store, and the tile index by
    multiply-high, hopper.fast_tile_div, forced on), "-um" (a Gluon name: no key tile masked where
    none can be cut, hopper.unmasked_full_keys, forced on), "-dt" (a persistent name: warpgroup 0's
    diagonal trimmed, hopper.diag_trim, forced on) and "-pb" or "-nopb" (a "-lean" or wg3 name: the
    consumers' redundant partition barriers dropped from the PTX, hopper.ptx_barriers, forced on or off)
    and "-wt", "-wtall" or "-nowt" (a persistent name: the causal walk from the host's table,
    hopper.walk_table, forced on, on as one group of heads (its balance without its locality), or off;
    then "-wtcC" and / or "-wtgM": the table's modelled fixed cost a tile, C key tiles, and its groups'
    K / V budget, M MB, in place of hopper.WALK_TABLE_TILE_COST / WALK_TABLE_L2_BYTES);
    without them the launcher's default, in that order
    (e.g. gluon-pp-fma25, gluon-wg3-fma50, gluon-pers-lean-accstore, gluon-pers-lean-q2-nopair,
    gluon-pp-lean-crw-n64-s4, gluon-pers-lean-ds-tma, gluon-pers-lean-crw-ds-um, gluon-pers-lean-ds-dt,
    gluon-pers-lean-ds-wt)."""
    m = re.fullmatch(r"(.+?)(?:-fma(\d+))?(-accstore)?(-crw?)?(?:-n(\d+))?(?:-s(\d+))?(-(?:no)?q2)?(-(?:no)?pair)?"
                     r"(-qr)?(-ds)?(-(?:no)?mb)?(-tma)?(-fd)?(-um)?(-dt)?(-(?:no)?pb)?(-(?:no)?wt(?:all)?)?(?:-wtc(\d+))?(?:-wtg(\d+))?", name)
    base, fma, acc, cr = m.group(1), m.group(2), bool(m.group(3)), {None: None, "-cr": "thread", "-crw": "warp"}[m.group(4)]
    gtiles = (int(m.group(5) or 0), int(m.group(6) or 0)) if m.group(5) or m.group(6) else None
    # None: the launcher's default; True / False: forced ("-q2" / "-noq2", "-pair" / "-nopair")
    q2, pair = ((None if g is None else not g.startswith("-no")) for g in (m.group(7), m.group(8)))
    if base not in loads or (fma is not None and (fma not in FMA_SUFFIX or not base.startswith("gluon"))) \
            or ((acc or gtiles) and not base.startswith("gluon")) \
            or (m.group(9) and not base.endswith("-lean")) \
            or ((m.group(10) or m.group(11)) and not (base.startswith("gluon-wg3") or base.endswith("-lean"))) \
            or (cr and not (base.startswith("gluon-wg3") or base.endswith("-lean"))) \
            or ((q2 is not None or pair is not None or m.group(12) or m.group(13) or m.group(15) or m.group(17)
                 or m.group(18) or m.group(19))
                and not base.startswith("gluon-pers")) \
            or (m.group(14) and not base.startswith("gluon")) \
            or (m.group(16) and not (base.startswith("gluon-wg3") or base.endswith("-lean"))):
        raise SystemExit(f"unknown --loads name {name!r}: one of {', '.join(loads)}, a Gluon name may take "
                         f"-fma{{{','.join(FMA_SUFFIX)}}}, -accstore, -cr / -crw, a persistent one -q2 / -noq2 and "
                         f"-pair / -nopair")
    return (loads[base], FMA_SUFFIX[fma] if fma else 0.0, acc, q2, pair, cr, gtiles, bool(m.group(9)),
            bool(m.group(10)), None if m.group(11) is None else m.group(11) == "-mb", bool(m.group(12)) or None,
            bool(m.group(13)) or None, bool(m.group(14)) or None, bool(m.group(15)) or None,
            None if m.group(16) is None else m.group(16) == "-pb",
            {None: None, "-nowt": False, "-wt": True, "-wtall": "all"}[m.group(17)],
            None if m.group(18) is None else int(m.group(18)), None if m.group(19) is None else int(m.group(19)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--headdims", default="64,128")
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--tiles", default="default", help="';'-separated block_m,block_n,warps,stages or 'default'")
    ap.add_argument("--loads", default="ptr,tma",
                    help="variants to cross with the tiles: ptr, tma, tma-r8 "
                         "(TMA + conditional rescaling, tau 8), gluon, gluon-pp, gluon-split, gluon-wg3, gluon-pers, "
                         "gluon-pp-lean / -nolean, gluon-split-..., gluon-pers-... (hopper.lean_softmax forced); "
                         "a Gluon name + \"-fma12/-fma25/-fma50/-fma100\": that share (%%; 12 = 12.5) of the "
                         "exponentials on the FMA units (hopper.exp2_fma); + \"-accstore\": the output stored from "
                         "the accumulator layout (hopper.out_row_stores off); + \"-q2\" / \"-pair\" (persistent): "
                         "two Q buffers a warpgroup / the causal walk by pairs, forced on (\"-noq2\" / "
                         "\"-nopair\": off) (the "
                         "Gluon Hopper forward's base, ping-pong, unordered two-warpgroup, three-warpgroup and "
                         "persistent ping-pong variants; "
                         "their own tiles, so only with 'default'; wg3 has head dim 64 only)")
    ap.add_argument("--causal", default="0,1", help="masks: 0 (none), 1 (causal) or both")
    ap.add_argument("--heads", type=int, default=0,
                    help="query (= K/V) heads; 0: hidden 2048 / head dim (the bench's grid). A count whose tiles fill "
                         "whole waves of the SMs isolates the last wave's idle SMs")
    ap.add_argument("--tag", default="ab_fwd", help="name of the JSON-lines file")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved timing rounds (median of their medians)")
    ap.add_argument("--rest", type=float, default=0.0, help="idle seconds before each timing: the board's power "
                    "limiter lowers the SM clock under sustained load, so every variant starts rested")
    ap.add_argument("--sass", action="store_true",
                    help="at the end, each Gluon forward kernel compiled in this process: its SASS's counts of "
                         "products, exponentials, stores and TMA operations, and the ptxas version (what the "
                         "compiler kept, read where it ran)")
    args = ap.parse_args()
    if args.rounds < 1 or args.rest < 0:
        ap.error(f"--rounds must be at least 1 and --rest at least 0, got {args.rounds} and {args.rest}")
    os.makedirs(args.out, exist_ok=True)
    sink = open(os.path.join(args.out, f"{args.tag}.jsonl"), "w")
    peers = {n: fn for n, (fn, _) in providers(["sdpa-flash", "sdpa-cudnn"]).items() if fn is not None}
    tile_sets = [None if t == "default" else dispatch.TileConfig(*map(int, t.split(",")))
                 for t in args.tiles.split(";")]
    loads = {"ptr": (False, None, 0.0), "tma": (True, None, 0.0), "tma-r8": (True, None, 8.0),
             "gluon": (True, "base", 0.0), "gluon-pp": (True, "pingpong", 0.0), "gluon-split": (True, "split", 0.0),
             "gluon-wg3": (True, "wg3", 0.0), "gluon-pers": (True, "persistent", 0.0)}
    # the two-warpgroup variants with and without the lean softmax (hopper.lean_softmax, on by default)
    loads.update({f"{n}-{s}": (*loads[n], s == "lean") for n in ("gluon-pp", "gluon-split", "gluon-pers")
                  for s in ("lean", "nolean")})
    parsed = {name: parse_load(name, loads) for name in args.loads.split(",")}
    fns = {f"{name}-{'dflt' if c is None else '.'.join(map(str, (c.block_m, c.block_n, c.num_warps, c.num_stages)))}":
           variant_fn(*entry[:3], c, exp2_fma, *entry[3:4], acc_stores=acc, q_prefetch=q2, paired=pair,
                      cond_rescale=cr, gtiles=gt, q_regs=qr, deferred_sum=ds, mask_branch=mb, tma_store=tma,
                      fast_div=fd, unmasked=um, diag_trim=dt, ptx_bars=pb, walk_tab=wt, walk_cost=wtc, walk_mb=wtg)
           for c in tile_sets
           for name, (entry, exp2_fma, acc, q2, pair, cr, gt, qr, ds, mb, tma, fd, um, dt, pb, wt, wtc, wtg)
           in parsed.items()
           if not (name.startswith("gluon") and c is not None)}
    fns.update(peers)
    rows = []
    for d in map(int, args.headdims.split(",")):
        for causal in [bool(int(c)) for c in args.causal.split(",")]:
            ok = {}
            for n in map(int, args.seqlens.split(",")):
                shape = (16384 // n, n, args.heads or 2048 // d, d)
                q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                times, broken = {name: [] for name in fns}, set()
                order = list(fns)
                for r in range(args.rounds):  # interleaved: round r starts at variant r
                    for name in order[r % len(order):] + order[:r % len(order)]:
                        if name in broken:
                            continue  # raised in an earlier round: reported once
                        fn = fns[name]
                        try:  # a variant that fails to compile or run is reported and the rest go on
                            if name not in ok:
                                ok[name] = _check(fn, q, k, v, causal)[0]
                            time.sleep(args.rest)
                            with torch.no_grad():
                                times[name].append(median_ms(lambda s: fn(*s, causal), [(q, k, v)]))
                        except Exception as e:  # noqa: BLE001
                            print(f"{name} d={d} causal={causal} N={n}: {type(e).__name__}: {str(e)[:2000]}",
                                  flush=True)
                            ok[name] = False
                            broken.add(name)
                for name in order:
                    ms = statistics.median(times[name]) if times[name] else float("inf")
                    tf = attention_flops(shape[0], shape[2], n, n, d, causal, "fwd") / ms / 1e9
                    rec = dict(headdim=d, causal=causal, seqlen=n, heads=shape[2], variant=name,
                               ok=ok.get(name, False), ms=ms, tflops=tf, ms_rounds=times[name])
                    sink.write(json.dumps(rec) + "\n")
                    sink.flush()
                    rows.append(rec)
    names = list(fns)
    print(f"{'d':>3} {'c':>1} {'N':>6} " + " ".join(f"{n[-12:]:>12}" for n in names) + "   best/flash")
    for d in sorted({r["headdim"] for r in rows}):
        for causal in sorted({r["causal"] for r in rows}):
            for n in sorted({r["seqlen"] for r in rows}):
                cell = {r["variant"]: r for r in rows if (r["headdim"], r["causal"], r["seqlen"]) == (d, causal, n)}
                vals = [f"{cell[x]['tflops']:12.0f}" if cell[x]["ok"] else f"{'FAIL':>12}" for x in names]
                ours = max([r["tflops"] for x, r in cell.items() if not x.startswith("sdpa") and r["ok"]] or [0.0])
                ref = cell.get("sdpa-flash")
                ratio = f"{ours / ref['tflops']:.2f}" if ref else "-"
                print(f"{d:>3} {int(causal):>1} {n:>6} " + " ".join(vals) + f"   {ratio}")
    if args.sass:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
        from gluon_aot import print_compiled_sass  # tools/, beside the compile checks
        from ioattn.kernels import hopper_forward as hf
        print_compiled_sass((hf.hopper_fwd_kernel,), ("HGMMA", "MUFU.EX2", "STS", "UTMALDG", "UTMASTG"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
