"""One small call of each GPU kernel family, for compute-sanitizer (memcheck, racecheck):
the Gluon Hopper forward (every variant) and the portable backward it feeds, the Gluon backward
(the ws kernel), the portable forward, and a split decode step with its merge (normal and
programmatic dependent launch; contiguous, and paged through TMA).

    compute-sanitizer --tool memcheck  python benchmarks/sanitize_small.py [--heads 256] [--no-forward]
                                                                           [--varlen] [--window] [--softcap]
                                                                           [--alibi]

``--heads``: the head dims of the attention calls (default 64,128,256); ``--no-forward``: only the
Gluon backward kernels of those head dims and the decode calls (the forward variants skipped).
The decode calls include the tail split (whole units, then split ones); the persistent forward also
runs with several tiles a program (its walk, the paired causal walk, the causal walk from the host's
table and the Q buffers). ``--varlen``: only the Gluon backward's packed-sequence form (ws,
``IS_VARLEN``) at those head dims, both masks and two sliding windows (``WINDOW``), plain and
deterministic, on ragged sequences (a
sequence with no queries, one with no keys, seqlen_q != seqlen_k) with trailing rows no sequence
owns (NaN: the producer zeroes what the last tiles read of them). ``--window``: only the Gluon
forward's sliding-window form (``WINDOW``) at those head dims, every variant that has it
(``hopper.WINDOW_VARIANTS``), three windows, fixed length (seqlen_q != seqlen_k) and packed (the
ragged sequences above, ``IS_VARLEN``). ``--softcap``: only the Gluon backward's softcap form (ws,
``SOFTCAP``) at those head dims (d = 128 also as the column split), no mask, causal and a window, fixed
length (seqlen_q != seqlen_k) and packed (the ragged sequences above). ``--alibi``: likewise the Gluon
forward's and backward's ALiBi forms (``ALIBI``; with ``--softcap`` both forms together).
``--padded``: only head dims the Gluon kernels lack, run in place at the next one (``--heads`` those,
e.g. 80,96,192: ``hopper.padded_in_place``, the kernels' ``IO_DIM``, TMA boxes past d), the forward in
the persistent and ping-pong kernels, both masks, and the ws backward plain and deterministic, at a
shape with GQA, seqlen_q != seqlen_k and partial tiles (the forward also at whole key tiles, where d =
136-192 take the split ring); then the forms there (a window, causal softcap
+ ALiBi; packed sequences with NaN in the unowned rows, with a window and with causal ALiBi).
"""
import argparse

import torch

import ioattn
from ioattn import decode
from ioattn.plan import hopper
from ioattn import backends
from ioattn.plan import hopper_bwd
from ioattn.plan.hopper_bwd import BWD_VARIANT_HEADDIMS
from ioattn.backends import hopper_backward

ap = argparse.ArgumentParser()
ap.add_argument("--heads", default="64,128,256")
ap.add_argument("--no-forward", action="store_true")
ap.add_argument("--varlen", action="store_true")
ap.add_argument("--window", action="store_true")
ap.add_argument("--softcap", action="store_true")
ap.add_argument("--alibi", action="store_true")
ap.add_argument("--padded", action="store_true")
args = ap.parse_args()
torch.manual_seed(0)
dev, dt = "cuda", torch.bfloat16
if args.window:
    lens_q, lens_k, extra = [1, 100, 333, 0, 64, 50], [1, 37, 200, 40, 300, 0], 7
    cu_q, cu_k = (torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=torch.int32, device=dev)
                  for n in (lens_q, lens_k))
    for d in map(int, args.heads.split(",")):
        q = torch.randn(2, 300, 3, d, device=dev, dtype=dt)
        k = torch.randn(2, 340, 1, d, device=dev, dtype=dt)
        qp = torch.randn(sum(lens_q) + extra, 3, d, device=dev, dtype=dt)
        kp = torch.randn(sum(lens_k) + extra, 1, d, device=dev, dtype=dt)
        kp[sum(lens_k):] = float("nan")
        for name in hopper.WINDOW_VARIANTS:
            if d not in hopper.TILE_TABLE[name]:
                continue
            with hopper.variant(name), hopper.prefer_hopper(True), torch.no_grad():
                for window in ((100, 0), (64, 64), (-1, 30)):
                    ioattn.flash_attn_func(q, k, k, window_size=window)
                    ioattn.flash_attn_varlen_func(qp, kp, kp, cu_q, cu_k, max(lens_q), max(lens_k),
                                                  window_size=window)
    torch.cuda.synchronize()
    print("sanitize_small --window: done")
    raise SystemExit(0)
if args.softcap or args.alibi:
    cap = 20.0 if args.softcap else 0.0
    lens_q, lens_k, extra = [1, 100, 333, 0, 64, 50], [1, 37, 200, 40, 300, 0], 7
    cu_q, cu_k = (torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=torch.int32, device=dev)
                  for n in (lens_q, lens_k))
    for d in map(int, args.heads.split(",")):
        fixed = [torch.randn(2, n, hh, d, device=dev, dtype=dt) for n, hh in ((300, 3), (340, 1), (340, 1))]
        packed = [torch.randn(sum(n) + extra, hh, d, device=dev, dtype=dt) for n, hh in
                  ((lens_q, 3), (lens_k, 1), (lens_k, 1))]
        for t, n in zip(packed, (lens_q, lens_k, lens_k)):
            t[sum(n):] = float("nan")
        slopes = (torch.rand(2, 3, device=dev), torch.rand(len(lens_q), 3, device=dev)) if args.alibi else (None, None)
        bwd_ok = not (args.softcap and args.alibi and d in hopper_bwd.BWD_ALIBI_SOFTCAP_REFUSED)
        for split in ((), (128,)) if d == 128 and args.softcap else ((),):
            hopper_bwd.WS_SOFTCAP_COL_SPLIT_HEADDIMS = split
            backends.clear_routes()  # the plans are cached on the switches, not on this table
            for causal, window in ((False, (-1, -1)), (True, (-1, -1)), (False, (100, 0))):
                kw = dict(causal=causal, window_size=window, softcap=cap, return_attn_probs=True)
                with torch.no_grad(), hopper.prefer_hopper(True):
                    out, lse = ioattn.flash_attn_func(*fixed, alibi_slopes=slopes[0], **kw)[:2]
                    if bwd_ok:
                        hopper_backward(torch.randn_like(out), *fixed, out, lse, d ** -0.5, causal,
                                        window=window, softcap=cap, alibi_slopes=slopes[0])
                    out, lse = ioattn.flash_attn_varlen_func(*packed, cu_q, cu_k, max(lens_q), max(lens_k),
                                                             alibi_slopes=slopes[1], **kw)[:2]
                    if bwd_ok:
                        hopper_backward(torch.randn_like(out), *packed, out, lse, d ** -0.5, causal,
                                        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                                        max_seqlen_k=max(lens_k), window=window, softcap=cap,
                                        alibi_slopes=slopes[1])
    torch.cuda.synchronize()
    print(f"sanitize_small{' --softcap' if args.softcap else ''}{' --alibi' if args.alibi else ''}: done")
    raise SystemExit(0)
if args.padded:
    for d in map(int, args.heads.split(",")):
        assert hopper.padded_in_place(d), d
        q = torch.randn(2, 300, 3, d, device=dev, dtype=dt)
        k, v = (torch.randn(2, 340, 1, d, device=dev, dtype=dt) for _ in range(2))
        for name in ("persistent", "pingpong"):
            if hopper.padded_headdim(d) not in hopper.TILE_TABLE[name]:
                continue
            for causal in (False, True):
                with hopper.variant(name):
                    out, lse = backends.hopper_forward(q, k, v, d ** -0.5, causal)
                for det in (False, True):
                    hopper_backward(torch.randn_like(out), q, k, v, out, lse, d ** -0.5, causal,
                                    deterministic=det)
                # whole 64-key tiles (320 keys): the forward's split ring at d = 136-192 (hopper.split_ring)
                with hopper.variant(name):
                    backends.hopper_forward(q, k[:, :320], v[:, :320], d ** -0.5, causal)
        # the kernels' forms in place: a window, softcap + ALiBi (causal), and packed sequences with NaN
        # in the rows no sequence owns (a window, then causal ALiBi)
        slopes = torch.rand(3, device=dev)
        for kw in (dict(window=(100, 0)), dict(softcap=20.0, alibi_slopes=slopes)):
            causal = "softcap" in kw
            out, lse = backends.hopper_forward(q, k, v, d ** -0.5, causal, **kw)
            hopper_backward(torch.randn_like(out), q, k, v, out, lse, d ** -0.5, causal, **kw)
        lens_q, lens_k, extra = [1, 100, 333, 0, 64, 50], [1, 37, 200, 40, 300, 0], 7
        cu_q, cu_k = (torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=torch.int32, device=dev)
                      for n in (lens_q, lens_k))
        qp = torch.randn(sum(lens_q) + extra, 3, d, device=dev, dtype=dt)
        kp, vp = (torch.randn(sum(lens_k) + extra, 1, d, device=dev, dtype=dt) for _ in range(2))
        for t, n in ((qp, sum(lens_q)), (kp, sum(lens_k)), (vp, sum(lens_k))):
            t[n:] = float("nan")
        packed = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
        for causal, kw in ((False, dict(window=(100, 0))), (True, dict(alibi_slopes=torch.rand(len(lens_q), 3,
                                                                                                 device=dev)))):
            out, lse = backends.hopper_forward(qp, kp, vp, d ** -0.5, causal, **packed, **kw)
            for det in (False, True):
                hopper_backward(torch.randn_like(out), qp, kp, vp, out, lse, d ** -0.5, causal,
                                deterministic=det, **packed, **kw)
    torch.cuda.synchronize()
    print("sanitize_small --padded: done")
    raise SystemExit(0)
if args.varlen:
    lens_q, lens_k, extra = [1, 100, 333, 0, 64, 50], [1, 37, 200, 40, 300, 0], 7
    cu_q, cu_k = (torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=torch.int32, device=dev)
                  for n in (lens_q, lens_k))
    for d in map(int, args.heads.split(",")):
        q = torch.randn(sum(lens_q) + extra, 3, d, device=dev, dtype=dt)
        k, v = (torch.randn(sum(lens_k) + extra, 1, d, device=dev, dtype=dt) for _ in range(2))
        dout = torch.randn_like(q)
        for t, n in ((q, sum(lens_q)), (k, sum(lens_k)), (v, sum(lens_k)), (dout, sum(lens_q))):
            t[n:] = float("nan")
        for causal in (False, True):
            out, lse = ioattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                                     return_attn_probs=True)[:2]
            for det in (False, True):
                hopper_backward(dout, q, k, v, out, lse, d ** -0.5, causal, deterministic=det,
                                cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                                max_seqlen_k=max(lens_k))
        for window in ((100, 0), (64, 64)):  # a sliding window with the packed sequences (WINDOW, IS_VARLEN)
            out, lse = ioattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), window_size=window,
                                                     return_attn_probs=True)[:2]
            for det in (False, True):
                hopper_backward(dout, q, k, v, out, lse, d ** -0.5, False, deterministic=det,
                                cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                                max_seqlen_k=max(lens_k), window=window)
    torch.cuda.synchronize()
    print("sanitize_small --varlen: done")
    raise SystemExit(0)
b, sq, sk, h, hkv = 2, 300, 340, 3, 1
for d in map(int, args.heads.split(",")):
    q = torch.randn(b, sq, h, d, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(b, sk, hkv, d, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(b, sk, hkv, d, device=dev, dtype=dt, requires_grad=True)
    for name in hopper.VARIANTS:
        if d not in hopper.TILE_TABLE[name] or args.no_forward:
            continue
        for causal in (False, True):
            with hopper.variant(name), hopper.prefer_hopper(True):
                out = ioattn.flash_attn_func(q, k, v, causal=causal)
                torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    if not args.no_forward:
        with hopper.prefer_hopper(False):
            ioattn.flash_attn_func(q, k, v, causal=True)
    for causal in (False, True):  # the Gluon backward at its head dims (at 256: the column split)
        with hopper.prefer_hopper(True), torch.no_grad():
            out, lse = ioattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)[:2]
        if d in BWD_VARIANT_HEADDIMS["ws"]:
            hopper_backward(torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, d ** -0.5, causal)
# the persistent forward with several tiles a program (192 tiles of 128 rows on at most 132 programs),
# an even number of query blocks (the paired causal walk where it is the default), at d = 64 / 128 two
# Q buffers a warpgroup (hopper.persistent_options), the causal walk computed and from the host's table
# (hopper.walk_table, where it fits), and the output copied by TMA from the Q buffer
# (hopper.row_stores; the variant loop above runs it at 300 rows, past which the copy drops the rows)
for d in map(int, args.heads.split(",")):
    if args.no_forward:
        break
    q = torch.randn(4, 512, 12, d, device=dev, dtype=dt)
    k = torch.randn(4, 512, 4, d, device=dev, dtype=dt)
    for causal, table in ((False, None), (True, False), (True, True)):  # causal: the computed walk and the table
        with hopper.variant("persistent"), hopper.prefer_hopper(True), hopper.walk_table(table), torch.no_grad():
            ioattn.flash_attn_func(q, k, k, causal=causal)
q1 = torch.randn(2, 1, 32, 128, device=dev, dtype=dt)
kc = torch.randn(2, 4096, 8, 128, device=dev, dtype=dt)
vc = torch.randn_like(kc)
lens = torch.tensor([4000, 1234], device=dev, dtype=torch.int32)
for pdl in (False, True):
    with decode.decode_config(pdl=pdl, num_splits=7):
        ioattn.flash_attn_with_kvcache(q1, kc, vc, cache_seqlens=lens)
# a paged cache (pages of 256, random table) with many splits: the TMA path of decode.plan
pages = kc.view(32, 256, 8, 128)
table = torch.randperm(32, device=dev).view(2, 16).to(torch.int32)
with decode.decode_config(num_splits=20):
    ioattn.flash_attn_with_kvcache(q1, pages, vc.view(32, 256, 8, 128), cache_seqlens=lens, block_table=table)
# a launch without splits whose last batch element is split (tail split)
q3 = torch.randn(3, 1, 32, 128, device=dev, dtype=dt)
kc3 = torch.randn(3, 1000, 8, 128, device=dev, dtype=dt)
lens3 = torch.tensor([1000, 17, 999], device=dev, dtype=torch.int32)
with decode.decode_config(num_whole=16, num_splits=5):
    ioattn.flash_attn_with_kvcache(q3, kc3, kc3, cache_seqlens=lens3)
torch.cuda.synchronize()
print("sanitize_small: done")
