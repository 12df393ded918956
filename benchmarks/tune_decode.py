"""Sweep the split-KV decode kernel's launch choices on the device: load path (pointer / TMA),
key chunk (BLOCK_N), split count (in waves of programs over the SMs), pipeline stages. Writes one
JSON line per (case, layout, config) and prints the best config per case; the winners become the
heuristic in ``ioattn/plan/decode.py`` (``plan``), with this script's output kept beside it.

    python benchmarks/tune_decode.py --out DIR [--quick | --focus | --mla]

``--focus``: the cases still behind cuDNN (batch 1 with 4k-128k keys, batch 8 x 8192; contiguous
cache), pointer loads, BLOCK_N 64/128 x warps 4/8 x stages 2/3/4 x finer split waves, with SDPA's
cuDNN backend timed on each case in the same run (records with ``provider: "sdpa-cudnn"``).
``--focus --fp8``: the same on e4m3 caches (per-head descales), block_n 64/128/256 and stages up to
6 as well, with the default plan on the bf16 caches timed in the same run (records with ``provider:
"ioattn-bf16"``): the FP8 decode's time against bf16's (the target: 0.55x at 1 x 131072).
``--focus --paged``: the same cases on a paged cache (pages of 256, a random block table), pointer
and TMA loads, BLOCK_N 64/128 x warps 4/8 x split waves 1/2/3, with the default plan on the
contiguous cache timed in the same run (records with ``provider: "ioattn-contiguous"``): the
paged-within-5 % target is against that.

``--mla``: the Gluon MLA kernel's split count (``ioattn bench mla``'s shape: 128 query heads over one
latent KV head, 576 / 512) at 1 x 4096 to 1 x 131072 and 8 x 8192, every count from 1 to one program an SM
beside the default plan's (records with ``provider: "ioattn-default"``): each split writes a 64 x 512
fp32 partial a row block and the merge reads them back, so the fewest splits that still fill the SMs
may win (docs/decisions/mla-decode-kernel.md).

Cases: the decode table of the peers' numbers (32 query heads, 8 KV heads, d=128, bf16, one query
token). Timing: ``ioattn.bench.timing.median_ms`` (device time, median of 20), values trusted
(``check_values=False``), every config first checked against the float64 oracle on a small cache.
"""
import argparse
import itertools
import json
import math
import os
import sys

import torch

from ioattn.bench.timing import median_ms
from ioattn.decode import decode_config, flash_attn_with_kvcache
from ioattn.reference.decode import kvcache_attention_ref

CASES = [(1, 4096), (1, 16384), (1, 65536), (1, 131072), (8, 8192), (32, 32768), (64, 4096)]
HQ, HKV, D, PAGE = 32, 8, 128, 256


def make(batch, kvlen, paged, dtype=torch.bfloat16, fp8=False):
    shape = (batch * kvlen // PAGE, PAGE, HKV, D) if paged else (batch, kvlen, HKV, D)
    kc = torch.randn(shape, device="cuda", dtype=dtype)
    vc = torch.randn(shape, device="cuda", dtype=dtype)
    q = torch.randn(batch, 1, HQ, D, device="cuda", dtype=dtype)
    kw = dict(cache_seqlens=torch.full((batch,), kvlen, dtype=torch.int32, device="cuda"))
    if paged:
        kw["block_table"] = torch.randperm(shape[0], device="cuda").view(batch, -1).to(torch.int32)
    if fp8:  # e4m3 caches (contiguous), one descale a (sequence, KV head)
        (kc, kw["k_descale"]), (vc, kw["v_descale"]) = _e4m3(kc), _e4m3(vc)
    return q, kc, vc, kw


def _e4m3(cache):
    """(e4m3 cache, its (batch, KV heads) descales) of a contiguous (batch, keys, KV heads, d) cache."""
    descale = cache.float().abs().amax(dim=(1, 3)).clamp(min=1e-6) / 448
    return (cache.float() / descale[:, None, :, None]).to(torch.float8_e4m3fn), descale


def _dequantized(kc, vc, kw):
    """The caches as the FP8 kernel reads them, in float32 (the oracle's input)."""
    return (c.float() * kw[name][:, None, :, None] for c, name in ((kc, "k_descale"), (vc, "v_descale")))


def correct(cfg, paged, fp8=False):
    q, kc, vc, kw = make(2, 4096, paged, fp8=fp8)
    with decode_config(**cfg):
        out = flash_attn_with_kvcache(q, kc, vc, **kw, check_values=False)
    if fp8:  # against float64 attention of the dequantised caches; the bound: the default plan's error, twice
        plain = {k: v for k, v in kw.items() if not k.endswith("descale")}
        ref, _ = kvcache_attention_ref(q, *_dequantized(kc, vc, kw), **plain)
        same = flash_attn_with_kvcache(q, kc, vc, **kw, check_values=False)
    else:
        ref, _ = kvcache_attention_ref(q, kc, vc, **kw)
        same, _ = kvcache_attention_ref(q, kc, vc, **kw, upcast=False)
    err = (out.double() - ref).abs().max().item()
    base = (same.double() - ref).abs().max().item()
    return not math.isnan(err) and err <= 2 * base + 1e-4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--focus", action="store_true")
    ap.add_argument("--paged", action="store_true", help="with --focus: the paged cache")
    ap.add_argument("--fp8", action="store_true", help="with --focus: e4m3 caches (contiguous)")
    ap.add_argument("--mla", action="store_true", help="the MLA kernel's split counts instead")
    args = ap.parse_args()
    if args.mla:
        return mla(args.out)
    if args.fp8 and (args.paged or not args.focus):
        ap.error("--fp8 goes with --focus, on contiguous caches")
    if args.focus:
        return focus(args.out, args.paged, args.fp8)
    os.makedirs(args.out, exist_ok=True)
    sink = open(os.path.join(args.out, "tune_decode.jsonl"), "w")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    loads = [dict(use_tma=False, num_stages=2), dict(use_tma=True, num_stages=2), dict(use_tma=True, num_stages=3)]
    block_ns = [64] if args.quick else [32, 64, 128]
    waves = [1, 2, 4] if args.quick else [1, 2, 4, 8]
    best = {}
    for paged in (False, True):
        for load, bn in itertools.product(loads, block_ns):
            cfg = dict(load, block_n=bn, num_warps=4)
            try:
                ok = correct(cfg, paged)
            except Exception as e:  # noqa: BLE001 - e.g. a config that needs more shared memory than there is
                print(f"paged={paged} {cfg}: cannot run ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
                continue
            for batch, kvlen in CASES:
                q, kc, vc, kw = make(batch, kvlen, paged)
                bytes_kv = 2 * kc.numel() * kc.element_size()
                programs = batch * HKV
                for w in waves:
                    splits = max(1, min(math.ceil(w * sms / programs), kvlen // bn))
                    with decode_config(**cfg, num_splits=splits):
                        ms = median_ms(lambda s: flash_attn_with_kvcache(q, kc, vc, **kw, check_values=False), [0])
                    rec = dict(batch=batch, kvlen=kvlen, paged=paged, **cfg, waves=w, num_splits=splits, ok=ok,
                               us=ms * 1e3, gbps=bytes_kv / ms / 1e6)
                    sink.write(json.dumps(rec) + "\n")
                    sink.flush()
                    key = (batch, kvlen, paged)
                    if ok and (key not in best or rec["us"] < best[key]["us"]):
                        best[key] = rec
                del q, kc, vc, kw
                torch.cuda.empty_cache()
            print(f"paged={paged} {cfg} ok={ok}", flush=True)
    print(f"\n{'batch':>5} {'kvlen':>7} {'paged':>5} {'us':>8} {'GB/s':>7}  best config")
    for (batch, kvlen, paged), r in sorted(best.items()):
        print(f"{batch:>5} {kvlen:>7} {paged!s:>5} {r['us']:8.1f} {r['gbps']:7.0f}  tma={r['use_tma']} "
              f"stages={r['num_stages']} block_n={r['block_n']} waves={r['waves']} splits={r['num_splits']}")
    return 0


def focus(out, paged=False, fp8=False):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    os.makedirs(out, exist_ok=True)
    name = "tune_decode_focus" + ("_paged" if paged else "") + ("_fp8" if fp8 else "")
    sink = open(os.path.join(out, name + ".jsonl"), "w")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = [(1, 4096), (1, 16384), (1, 65536), (1, 131072), (8, 8192)]
    if paged:
        configs = [dict(use_tma=tma, block_n=bn, num_warps=w, num_stages=2)
                   for tma, bn, w in itertools.product((False, True), (64, 128), (4, 8))]
        waves = (1, 2, 3)
    elif fp8:  # half the bytes a chunk: longer chunks and deeper rings too
        configs = [dict(use_tma=False, block_n=bn, num_warps=w, num_stages=st)
                   for bn, w, st in itertools.product((64, 128, 256), (4, 8), (2, 3, 4, 6))]
        waves = (1, 1.5, 2, 3, 4)
    else:
        configs = [dict(use_tma=False, block_n=bn, num_warps=w, num_stages=st)
                   for bn, w, st in itertools.product((64, 128), (4, 8), (2, 3, 4))]
        waves = (1, 1.5, 2, 3, 4)
    data = {c: make(*c, paged=paged, fp8=fp8) for c in cases}
    best, cudnn, base = {}, {}, {}
    for batch, kvlen in cases:  # the peer first (on the contiguous bf16 cache: also our default plan)
        q, kc, vc, kw = make(batch, kvlen, paged=False) if paged or fp8 else data[(batch, kvlen)]
        qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)

        def peer(_):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        cudnn[(batch, kvlen)] = median_ms(peer, [0]) * 1e3
        sink.write(json.dumps(dict(provider="sdpa-cudnn", batch=batch, kvlen=kvlen, us=cudnn[(batch, kvlen)])) + "\n")
        if paged or fp8:  # our default plan on the contiguous (bf16) cache: what the sweep compares against
            if fp8:
                q, kc, vc, kw = make(batch, kvlen, paged=False)
                qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
            us = median_ms(lambda s: flash_attn_with_kvcache(q, kc, vc, **kw, check_values=False), [0]) * 1e3
            provider = "ioattn-bf16" if fp8 else "ioattn-contiguous"
            sink.write(json.dumps(dict(provider=provider, batch=batch, kvlen=kvlen, us=us)) + "\n")
            print(f"{provider} default plan {batch} x {kvlen}: {us:.1f} us (cuDNN {cudnn[(batch, kvlen)]:.1f})")
            base[(batch, kvlen)] = us
        del q, kc, vc, kw
    for cfg in configs:
        try:
            ok = correct(cfg, paged, fp8)
        except Exception as e:  # noqa: BLE001 - a config that does not fit
            print(f"{cfg}: cannot run ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            continue
        for batch, kvlen in cases:
            q, kc, vc, kw = data[(batch, kvlen)]
            bytes_kv = 2 * kc.numel() * kc.element_size()
            for w in waves:
                splits = max(1, min(math.ceil(w * sms / (batch * HKV)), kvlen // cfg["block_n"]))
                with decode_config(**cfg, num_splits=splits):
                    ms = median_ms(lambda s: flash_attn_with_kvcache(q, kc, vc, **kw, check_values=False), [0])
                rec = dict(provider="ioattn-paged" if paged else "ioattn-fp8" if fp8 else "ioattn", batch=batch,
                           kvlen=kvlen, **cfg, waves=w,
                           num_splits=splits, ok=ok,
                           us=ms * 1e3, gbps=bytes_kv / ms / 1e6)
                sink.write(json.dumps(rec) + "\n")
                if ok and ((batch, kvlen) not in best or rec["us"] < best[(batch, kvlen)]["us"]):
                    best[(batch, kvlen)] = rec
        sink.flush()
    print(f"\n{'batch':>5} {'kvlen':>7} {'us':>7} {'cudnn':>7} {'ratio':>6} {'/ bf16':>6}  best config")
    for key, r in sorted(best.items()):
        vs_bf16 = f"{r['us'] / base[key]:6.3f}" if fp8 else f"{'':>6}"
        print(f"{key[0]:>5} {key[1]:>7} {r['us']:7.1f} {cudnn[key]:7.1f} {cudnn[key] / r['us']:6.3f} {vs_bf16}  "
              f"block_n={r['block_n']} warps={r['num_warps']} stages={r['num_stages']} waves={r['waves']} "
              f"splits={r['num_splits']}")
    return 0



MLA_CASES = [(1, 4096), (1, 16384), (1, 32768), (1, 131072), (8, 8192)]


def mla_split_counts(programs, tiles, sms):
    """Split counts to time: powers of two and the counts that fill the SMs once or half, each at least
    one key tile a split."""
    fill = max(1, sms // programs)
    counts = {1 << i for i in range(9)} | {fill, max(1, fill // 2), max(1, fill * 3 // 4)}
    return sorted(c for c in counts if c <= min(fill, tiles))


def mla(out):
    from ioattn.bench.run import DecodeShape, _decode_inputs
    from ioattn.plan.decode import MLA_BLOCK_M, MLA_BLOCK_N

    os.makedirs(out, exist_ok=True)
    sink = open(os.path.join(out, "tune_decode_mla.jsonl"), "w")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{'batch':>5} {'kvlen':>7} {'default':>8} {'best':>8} {'splits':>6}  (us)")
    for batch, kvlen in MLA_CASES:
        shape = DecodeShape(batch, kvlen, 128, 1, 576, 512, True)
        q, k, v, seqlens = _decode_inputs(shape, torch.bfloat16, "cuda")
        ref, _ = kvcache_attention_ref(q[:1], k[:1], v[:1], cache_seqlens=seqlens[:1])
        same, _ = kvcache_attention_ref(q[:1], k[:1], v[:1], cache_seqlens=seqlens[:1], upcast=False)
        bound = 2 * (same.double() - ref).abs().max().item() + 1e-4

        def step():
            return flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, check_values=False)
        default = median_ms(lambda s: step(), [0]) * 1e3
        sink.write(json.dumps(dict(provider="ioattn-default", batch=batch, kvlen=kvlen, us=default)) + "\n")
        programs = batch * -(-128 // MLA_BLOCK_M)
        best = None
        for splits in mla_split_counts(programs, -(-kvlen // MLA_BLOCK_N), sms):
            with decode_config(num_splits=splits):
                err = (step()[:1].double() - ref).abs().max().item()
                us = median_ms(lambda s: step(), [0]) * 1e3
            rec = dict(provider="ioattn", batch=batch, kvlen=kvlen, num_splits=splits, ok=err <= bound, us=us)
            sink.write(json.dumps(rec) + "\n")
            if rec["ok"] and (best is None or us < best["us"]):
                best = rec
        sink.flush()
        print(f"{batch:>5} {kvlen:>7} {default:8.1f} {best['us'] if best else float('nan'):8.1f} "
              f"{best['num_splits'] if best else '-':>6}")
        del q, k, v, seqlens
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
