"""A/B of decode plan choices under `ioattn bench decode`'s conditions (input sets rotated past the
L2 cache, device time by ``median_ms``, cuDNN timed in the same run), for the cases where the
default still misses issue 4's bounds: batch 1 x 4096 (split count; eager and CUDA-graph replay)
and batch 8 x 8192 on a paged cache (key chunk, stages, split count; the contiguous default beside).
``--cases rest``: the contiguous cases where eager ioattn was 0.4-1.6 % behind cuDNN in
results/run-2026-12-01-i (batch 1 x 16k / 128k, 8 x 8192, 64 x 4096): split count, stages, warps.
``--cases wide``: the cases without splits (batch 64 x 4096, 32 x 32768): key chunk and stages.
``--cases waves``: batches 60-68 x 4096 (is batch 64's gap the last wave's tail?). ``--cases paged1``:
paged batch 1 x 4096, pointer loads against TMA, 16 or 32 splits. ``--cases lookup``: the paged block-table
read modes. ``--cases tail``: the tail split on and off, batches 17-100 x 4096. ``--cases near``: batches 17-24 x
4096 (just over one wave of units), uniform split counts. ``--cases tail64``: batch 64 x 4096 with a
forced tail split; ``--cases resident``: 64 / 66 x 4096 with several programs resident per SM; ``--cases wide64``: 64-key chunks on the
launches without splits; ``--cases onewave`` / ``onewave2`` / ``onewave_paged``: around the one-wave rule. (``--cases streamk`` measured a stream-K
partition, removed after it lost everywhere: results/run-2026-12-01-v, docs/decisions/decode-splits.md.)
``--rounds R`` times every entry R times, interleaved (the spread of one entry between rounds is
the noise the choice has to beat).

    python benchmarks/ab_decode.py --out DIR [--cases first|rest|wide|waves|paged1|lookup|tail|near] [--rounds R]

Writes DIR/ab_decode.jsonl (one record per case, layout, config, mode) and prints a table. The
tune script (`tune_decode.py --focus`) times one L2-resident input set; this one does not.
"""
import argparse
import json
import os

import torch

from ioattn.bench.providers import _unchecked, graph_replay, decode_providers, paged_copy
from ioattn.bench.run import _decode_inputs, decode_bytes
from ioattn.bench.timing import median_ms, n_input_sets
from ioattn.decode import decode_config, flash_attn_with_kvcache

HQ, HKV, D = 32, 8, 128
# (batch, kvlen, paged, graph, configs): {} is the default plan
CASES = [
    (1, 4096, False, True, [{}, dict(num_splits=16), dict(num_splits=64), dict(block_n=128),
                            dict(block_n=128, num_splits=16), dict(num_stages=2)]),
    (8, 8192, True, False, [{}, dict(block_n=64, num_stages=3), dict(block_n=64, num_stages=3, num_splits=7),
                            dict(num_splits=7), dict(block_n=64, num_stages=2, num_splits=7),
                            dict(num_warps=8)]),
    (8, 8192, False, False, [{}]),
]
REST = [
    (1, 16384, False, False, [{}, dict(num_splits=16), dict(num_splits=24), dict(num_stages=4),
                              dict(num_stages=2)]),
    (1, 131072, False, False, [{}, dict(num_splits=16), dict(num_splits=24), dict(num_splits=48),
                               dict(num_stages=4)]),
    (8, 8192, False, False, [{}, dict(num_splits=2), dict(num_splits=6), dict(num_splits=8),
                             dict(num_splits=16), dict(num_stages=4)]),
    (64, 4096, False, False, [{}, dict(num_stages=3), dict(num_warps=8), dict(num_splits=2),
                              dict(num_splits=2, block_n=128, num_stages=2)]),
]
# launches without splits (512 / 256 programs): the chunk and ring depth set how many programs fit an
# SM (128 keys x 2 stages: 128 KB of K/V ring, one program per SM)
WIDE = [
    (64, 4096, False, False, [{}, dict(block_n=64, num_stages=2), dict(block_n=64, num_stages=4),
                              dict(block_n=32, num_stages=4), dict(block_n=128, num_stages=1)]),
    (32, 32768, False, False, [{}, dict(block_n=64, num_stages=2), dict(block_n=64, num_stages=4)]),
]
# batch 64 x 4096 is 512 programs without splits, one per SM: 3.88 waves on 132 SMs. The batches around
# it (480 to 544 programs) show whether the step time follows the wave count (a tail to balance) or
# the bytes (nothing to gain by balancing); the 2-programs-per-SM tile beside the default
WAVES = [(b, 4096, False, False, [{}, dict(block_n=64, num_stages=3)]) for b in (60, 62, 64, 66, 68)]
# paged batch 1 x 4096 (4-7.5 % over contiguous): the contiguous plan's 16 splits of 256 keys through
# pointers, against the default 32 TMA splits, and the crossings; the contiguous default beside
PAGED1 = [
    (1, 4096, True, True, [{}, dict(use_tma=False, num_splits=16, block_n=64, num_stages=3),
                           dict(use_tma=False, num_splits=32, block_n=64, num_stages=3),
                           dict(use_tma=True, num_splits=16), dict(use_tma=True, num_splits=32, block_n=64)]),
    (1, 4096, False, True, [{}]),
]
# the block-table read (page_lookup 0: one chunk ahead, 1: in place, 2: first page guessed from the
# span) on the default paged plan and on the two best plans of results/run-2026-12-01-r
_PTR16 = dict(use_tma=False, num_splits=16, block_n=64, num_stages=3)
_TMA32 = dict(use_tma=True, num_splits=32, block_n=64)
LOOKUP = [
    (1, 4096, True, True, [{}, dict(page_lookup=1), dict(page_lookup=2), _PTR16, dict(_PTR16, page_lookup=1),
                           dict(_PTR16, page_lookup=2), _TMA32, dict(_TMA32, page_lookup=2)]),
    (1, 4096, False, True, [{}]),
    (1, 16384, True, False, [{}, dict(page_lookup=1), dict(page_lookup=2)]),
    (1, 16384, False, False, [{}]),
    (8, 8192, True, False, [{}, dict(page_lookup=1), dict(page_lookup=2)]),
    (8, 8192, False, False, [{}]),
]
# the tail split (decode._tail_split) against the launch without it, around the wave boundaries
TAIL = [(b, 4096, False, False, [{}, dict(tail_split=False)]) for b in (17, 34, 40, 64, 68, 70, 100)]
# just over one wave of units (batch 17-24 x 4096: 136-192 units, no split by the waves rule; batch 17
# took 105 us against cuDNN's 71 in results/run-2026-12-01-s): uniform splits with either tile
_WIDE = dict(block_n=128, num_stages=2)
NEAR = [(b, 4096, False, False, [{}, dict(num_splits=2), dict(num_splits=3), dict(num_splits=2, **_WIDE),
                                 dict(num_splits=3, **_WIDE), dict(num_splits=4, **_WIDE)]) for b in (17, 20, 24)]
# the wide tile without splits compiles to 186 registers (2 programs per SM) where its split
# launches take 168 (3 per SM; benchmarks/decode_occupancy.py, results/run-2026-12-01-x): capped
REGS = [(b, kv, False, False, [{}, dict(max_regs=168), dict(max_regs=160)])
        for b, kv in ((64, 4096), (32, 32768), (48, 4096), (17, 4096), (68, 4096), (100, 4096))]
# batches whose units do not fit one wave at 2 programs per SM but fit at 3 (the capped kernel)
REGS2 = [(b, 4096, False, False, [{}, dict(max_regs=168)]) for b in (36, 42, 45, 49, 56)]
# the same cap on paged caches (pages of 256 through TMA without splits; results/run-2026-12-01-y:
# paged 223.6 / 226.8 us at batch 42 / 48 against contiguous capped 169.5 / 186.7)
REGS_PAGED = [(b, 4096, True, False, [{}, dict(max_regs=168)]) for b in (42, 48, 64, 68)]
# paged through pointers at those batches, with and without the cap (the TMA launch above was level
# with its cap: 224.0 / 225.8 at 42, 226.4 / 228.5 at 48, run-2026-12-01-y)
PAGED_PTR = [(b, 4096, True, False, [{}, dict(use_tma=False), dict(use_tma=False, max_regs=168)])
             for b in (42, 48)] + [(48, 4096, False, False, [{}])]
# batch 64 x 4096 (512 units on 132 SMs, one program each: 3.88 waves, the last 88 % full) forced to
# a tail split (the default leaves a last wave over half full whole): the first 392 units whole (49
# batch elements, 2.97 waves), the last 120 split k ways and merged (docs/decisions/decode-splits.md); batch 66 (4.0 waves)
# and 60 beside, whose times bound what the last wave's idle SMs cost
TAIL64 = ([(64, 4096, False, False, [{}] + [dict(num_whole=392, num_splits=k) for k in (2, 4, 8, 11)]
            + [dict(num_whole=264, num_splits=k) for k in (4, 8)])]
          + [(b, 4096, False, False, [{}]) for b in (60, 66)])
# the same cases with more than one program resident per SM (a smaller ring, registers capped where
# the compiler's count would keep one): does a second program hide each program's start and end,
# where the SM has nothing in flight (docs/decisions/decode-one-wave.md)?
RESIDENT = [(b, 4096, False, False, [{}, dict(block_n=64, num_stages=2), dict(block_n=64, num_stages=2, max_regs=128),
                                     dict(block_n=64, num_stages=3, max_regs=168),
                                     dict(block_n=32, num_stages=4, max_regs=128)])
            for b in (64, 66)]
# the launches without splits and without a tail split (batches whose last wave is over half
# full, and 32 x 32768): 64-key chunks with 2 stages against the default's 128 (decode-one-wave.md); and the
# default without programmatic dependent launch of the step kernel at 64 / 66
_C64 = dict(block_n=64, num_stages=2)
WIDE64 = ([(b, 4096, False, False, [{}, _C64] + ([dict(pdl_wait=False)] if b in (64, 66) else []))
           for b in (60, 64, 66, 80, 96, 128)] + [(32, 32768, False, False, [{}, _C64])])
# around the one-wave rule (decode.ONE_WAVE_BLOCK_N, docs/decisions/decode-one-wave.md): batches 50-57 (397-456 units), where the
# tail split is taken first, against the one-wave launch; batch 80 (640 units, 7 % behind cuDNN in -zg)
# with 5 programs an SM (registers capped at 96)
_ONE = dict(block_n=64, num_stages=2, max_regs=128, tail_split=False)
ONEWAVE = ([(b, 4096, False, False, [{}, _ONE]) for b in (50, 52, 56)]
           + [(80, 4096, False, False, [{}, dict(block_n=64, num_stages=2, max_regs=96),
                                        dict(block_n=32, num_stages=2, max_regs=96)])])
# the one-wave rule with 4 or 5 programs an SM against the launch before it (an explicit
# block_n keeps the wide tile and the tail split), batches 50-82 x 4096; at 67 / 68 (tail split kept:
# 8 / 16 units past 4 waves) the one-wave launch forced as well
_ONE5 = dict(block_n=64, num_stages=2, max_regs=96, tail_split=False)
ONEWAVE2 = [(b, 4096, False, False, [{}, dict(block_n=128)] + ([_ONE5] if b in (67, 68) else []))
            for b in (52, 56, 60, 64, 66, 67, 68, 70, 72, 76, 80, 82)]
# paged caches (pages of 256) in the one-wave range: the rule (pointer loads, 64-key chunks,
# the cap) against the paged launch before it (TMA, 128-key chunks, the tail split where it applied)
ONEWAVE_PAGED = [case for b in (52, 56, 64, 68, 72, 80)
                 for case in ((b, 4096, True, False, [{}, dict(block_n=128)]), (b, 4096, False, False, [{}]))]
CASE_SETS = {"first": CASES, "rest": REST, "wide": WIDE, "waves": WAVES, "paged1": PAGED1, "lookup": LOOKUP,
             "tail": TAIL, "near": NEAR, "regs": REGS, "regs2": REGS2, "regs_paged": REGS_PAGED, "paged_ptr": PAGED_PTR,
             "tail64": TAIL64, "resident": RESIDENT,
             "wide64": WIDE64, "onewave": ONEWAVE,
             "onewave2": ONEWAVE2, "onewave_paged": ONEWAVE_PAGED}


def eager(q, kc, vc, lens, cfg, table=None):
    kw = dict(cache_seqlens=lens, **_unchecked())
    if table is not None:
        kw["block_table"] = table

    def run():
        with decode_config(**cfg):
            return flash_attn_with_kvcache(q, kc, vc, **kw)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", choices=sorted(CASE_SETS), default="first")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    fname = "ab_decode.jsonl" if args.cases == "first" else f"ab_decode_{args.cases}.jsonl"
    sink = open(os.path.join(args.out, fname), "w")
    cudnn_setup = decode_providers(["sdpa-cudnn"])["sdpa-cudnn"][0]
    rows = []
    with torch.no_grad():
        for batch, kvlen, paged, graph, configs in CASE_SETS[args.cases]:
            nbytes = decode_bytes(batch, kvlen, HKV, D, 2)
            sets = [_decode_inputs((batch, kvlen, HQ, HKV, D), torch.bfloat16, "cuda")
                    for _ in range(n_input_sets(nbytes))]
            timed = []
            if not paged:
                timed.append(("sdpa-cudnn", "eager", [cudnn_setup(*s) for s in sets]))
            for cfg in configs:
                name = ",".join(f"{k}={v}" for k, v in cfg.items()) or "default"
                if paged:
                    runs = []
                    for q, k, v, lens in sets:
                        kp, vp, table = paged_copy(k, v)
                        runs.append(eager(q, kp, vp, lens, cfg, table))
                else:
                    runs = [eager(*s, cfg) for s in sets]
                timed.append((name, "eager", runs))
                if graph:  # the same calls (paged ones included) captured and replayed
                    timed.append((name, "graph", [graph_replay(run) for run in runs]))
            for rnd, (name, mode, runs) in ((r, t) for r in range(args.rounds) for t in timed):
                us = median_ms(lambda run: run(), runs) * 1e3
                rec = dict(batch=batch, kvlen=kvlen, paged=paged, config=name, mode=mode, us=us,
                           gbps=nbytes / us / 1e3, round=rnd)
                sink.write(json.dumps(rec) + "\n")
                sink.flush()
                rows.append(rec)
                print(f"{batch:>3} {kvlen:>6} {'paged' if paged else 'contig':>6} {mode:>5} {us:8.1f} us  {name}",
                      flush=True)
            del sets, timed
            torch.cuda.empty_cache()
    if args.rounds > 1:  # median over rounds, per entry
        print("\nmedian over rounds (min-max):")
        keys = dict.fromkeys((r["batch"], r["kvlen"], r["paged"], r["config"], r["mode"]) for r in rows)
        for key in keys:
            us = sorted(r["us"] for r in rows if (r["batch"], r["kvlen"], r["paged"], r["config"], r["mode"]) == key)
            print(f"{key[0]:>3} {key[1]:>6} {'paged' if key[2] else 'contig':>6} {key[4]:>5} "
                  f"{us[len(us) // 2]:8.1f} us ({us[0]:.1f}-{us[-1]:.1f})  {key[3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
