"""Context-parallel attention timed under ``torchrun``: forward + backward of one attention call over
a sequence sharded across the processes, ioattn's ring (contiguous and zig-zag), all-to-all and
(from 4 processes) all-to-all over a ring, beside PyTorch's own context parallelism
(``torch.distributed.tensor.experimental.context_parallel`` around SDPA, its default load balancing)
and single-device ``flash_attn_func`` on the whole sequence, in the same run:

    torchrun --nproc-per-node 2 -m ioattn.bench.context_parallel --seqlen 131072 --out DIR

Each provider's time is the slowest process's median over ``--reps`` synchronised runs (the
processes start each run together after a barrier; wall-clock time to the end of the backward, the
device synchronised). The single-device time is each process's own call on the whole sequence, run
by every process at once. Every sharded output is gathered and compared with the single-device one
(``max_rel_diff``). Records go to DIR/results.jsonl (rank 0), one per provider and mask, with
``ratio_to_single`` and ``ratio_to_torch_cp``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from ioattn import flash_attn_func
from ioattn.bench.run import environment
from ioattn.bench.timing import attention_flops
from ioattn.distributed import ring_attention, shard, ulysses_attention, ulysses_ring_groups, unshard

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(step, reps, warmup, device):
    """The slowest process's median wall-clock ms of ``step()``, every run started after a barrier."""
    for _ in range(warmup):
        step()
    _sync(device)
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    slowest = torch.tensor([statistics.median(times)], dtype=torch.float64, device=_comm_device(device))
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.item(), times


def _comm_device(device):
    return device if dist.get_backend() == "nccl" else torch.device("cpu")


def _fwd_bwd(attend, q, k, v, dout):
    """A step: attention on leaves made from q, k, v, then its backward with ``dout``."""
    def step():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = attend(*leaves)
        out.backward(dout)
        return out
    return step


def _ioattn_providers(world, causal, heads):
    """name -> (layout, attention over local shards, sharding layers [(layout, group)])."""
    providers = {
        "ioattn-ring": ("contiguous", lambda q, k, v: ring_attention(q, k, v, causal=causal), None),
        "ioattn-ring-zigzag": ("zigzag", lambda q, k, v: ring_attention(q, k, v, causal=causal, layout="zigzag"),
                               None),
    }
    if heads % world == 0:
        providers["ioattn-ulysses"] = ("contiguous", lambda q, k, v: ulysses_attention(q, k, v, causal=causal), None)
    if world >= 4 and world % 2 == 0 and heads % 2 == 0:
        ug, rg = ulysses_ring_groups(2)
        providers["ioattn-ulysses2-ring"] = (
            "zigzag", lambda q, k, v: ulysses_attention(q, k, v, ug, causal=causal, layout="zigzag", ring_group=rg),
            [("zigzag", rg), ("contiguous", ug)])
    return providers


def _layers(layout, layers):
    return layers or [(layout, None)]


def _shard(x, layers):
    for layout, g in layers:
        x = shard(x, layout, g)
    return x.contiguous()


def _unshard(x, layers):
    for layout, g in reversed(layers):
        x = unshard(x, layout, g)
    return x


def _rel_diff(out, ref):
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


def _torch_cp(q, k, v, dout, causal, device, reps, warmup):
    """PyTorch's context parallelism: SDPA on (batch, heads, seqlen, dim) buffers that
    ``context_parallel`` shards in place (its load balancing for causal), under its dispatcher."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    def attend(a, b, c):
        return torch.nn.functional.scaled_dot_product_attention(a, b, c, is_causal=causal)

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    bufs = [t.transpose(1, 2).contiguous() for t in (q, k, v, dout)]
    with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2] * 4, no_restore_buffers=set(bufs)):
        step = _fwd_bwd(attend, *bufs)
        ms, times = _time(step, reps, warmup, device)
        out = step().detach()
        full = context_parallel_unshard(mesh, [out], [2])[0]
    return ms, times, full.transpose(1, 2)


def run(args):
    device = torch.device(args.device)
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[args.dtype]
    env = environment()
    records = []
    for causal in args.causal:
        torch.manual_seed(0)  # the same full problem in every process
        shape = (args.batch, args.seqlen, args.nheads, args.headdim)
        q, k, v, dout = (torch.randn(shape, dtype=dtype, device=device) for _ in range(4))
        flops = attention_flops(args.batch, args.nheads, args.seqlen, args.seqlen, args.headdim, causal, "fwdbwd")
        base = dict(sweep="context-parallel", dtype=args.dtype, batch=args.batch, nheads=args.nheads,
                    nheads_kv=args.nheads, headdim=args.headdim, seqlen_q=args.seqlen, seqlen_k=args.seqlen,
                    causal=causal, mode="fwdbwd", world_size=world, device=env["device"], env=env,
                    command="torchrun -m ioattn.bench.context_parallel " + " ".join(args.argv))

        def record(provider, ms=None, times=None, diff=None, error=None):
            rec = dict(base, provider=provider, ms=ms, ms_reps=times, max_rel_diff=diff,
                       tflops=flops / ms / 1e9 if ms else None,
                       ok=error is None and (diff is None or diff <= args.tolerance))
            if error:
                rec["error"] = error
            records.append(rec)
            if rank == 0:
                shown = f"{ms:10.2f} ms" if ms else "   (failed)  "
                print(f"{provider:<22} causal={int(causal)} n={args.seqlen} {shown}"
                      + (f"  rel diff {diff:.1e}" if diff is not None else "") + (f"  {error}" if error else ""),
                      flush=True)

        single_step = _fwd_bwd(lambda a, b, c: flash_attn_func(a, b, c, causal=causal), q, k, v, dout)
        ms, times = _time(single_step, args.reps, args.warmup, device)
        reference = single_step().detach()
        record("ioattn-single-device", ms, times)
        for name, (layout, attend, layers) in _ioattn_providers(world, causal, args.nheads).items():
            if args.providers and name not in args.providers:
                continue
            layers = _layers(layout, layers)
            local = [_shard(t, layers) for t in (q, k, v, dout)]
            try:
                step = _fwd_bwd(attend, *local)
                ms, times = _time(step, args.reps, args.warmup, device)
                record(name, ms, times, _rel_diff(_unshard(step().detach(), layers), reference))
            except Exception as e:  # noqa: BLE001 - a provider that cannot run is reported
                record(name, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        if not args.providers or "torch-cp" in args.providers:
            try:
                ms, times, full = _torch_cp(q, k, v, dout, causal, device, args.reps, args.warmup)
                record("torch-cp", ms, times, _rel_diff(full, reference))
            except Exception as e:  # noqa: BLE001
                record("torch-cp", error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        _ratios([r for r in records if r["causal"] == causal])
    return records


def _ratios(records):
    by = {r["provider"]: r["ms"] for r in records}
    for r in records:
        if r["ms"] and by.get("ioattn-single-device"):
            r["ratio_to_single"] = r["ms"] / by["ioattn-single-device"]
        if r["ms"] and by.get("torch-cp"):
            r["ratio_to_torch_cp"] = r["ms"] / by["torch-cp"]


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=131072, help="global tokens (default 131072)")
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--nheads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    ap.add_argument("--causal", type=lambda s: [bool(int(x)) for x in s.split(",")], default=[True, False],
                    help="comma-separated 1 / 0 (default 1,0)")
    ap.add_argument("--providers", type=lambda s: [x for x in s.split(",") if x], default=None,
                    help="a subset of ioattn-ring, ioattn-ring-zigzag, ioattn-ulysses, ioattn-ulysses2-ring, "
                         "torch-cp (default all that apply; the single-device time always runs)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=2e-2,
                    help="largest max |out - single-device out| / max |single-device out| that counts as ok")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None, help="folder for results.jsonl (written by rank 0)")
    args = ap.parse_args(argv)
    args.argv = list(argv) if argv is not None else __import__("sys").argv[1:]
    return args


def main(argv=None):
    args = parse(argv)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    if args.device == "cuda":
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
        args.device = f"cuda:{torch.cuda.current_device()}"
    try:
        records = run(args)
        if dist.get_rank() == 0 and args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "results.jsonl"), "w") as f:
                for rec in records:
                    f.write(json.dumps(rec) + "\n")
            print(f"wrote {len(records)} records to {os.path.join(args.out, 'results.jsonl')}")
        ok = all(r["ok"] for r in records if r["provider"].startswith("ioattn"))
        dist.barrier()  # every process done before any tears the group down (Gloo can abort otherwise)
    finally:
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
