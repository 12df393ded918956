"""One process of a ``tests/test_distributed.py`` run: ``python distributed_worker.py SUITE RANK WORLD DIR
[--cuda]``.

The processes meet through a file store in DIR (Gloo on CPU tensors; with ``--cuda``, NCCL on GPU
RANK, as ``tests/gpu/test_gpu_distributed.py`` runs it), run every case of SUITE and write what they
saw to DIR/rank<RANK>.json: for attention cases rank 0 gathers the shards and checks output, lse and
gradients against the float64 oracle on the whole sequence (twice PyTorch's own same-dtype error, as
every kernel test) and against single-process ``flash_attn_func``; for error cases each rank records
the exception it raised. A case's failure is recorded, never raised, so that the other cases run.
"""
import datetime
import json
import os
import pathlib
import subprocess
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
if __name__ == "__main__":  # before conftest's default: the CPU path unless the launcher asks for the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "0")

from conftest import (assert_lse_close, assert_matches_oracles, assert_varlen_sequences,  # noqa: E402
                      attention_oracles, child_env, max_err)

from ioattn import flash_attn_func, flash_attn_varlen_func  # noqa: E402
from ioattn.distributed import (ring_attention, shard, ulysses_attention, ulysses_ring_groups,  # noqa: E402
                                unshard)
from ioattn.masks import normalize_window  # noqa: E402
from ioattn.plan import dispatch  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


DEVICE = torch.device("cpu")  # set by main: the rank's GPU with --cuda


def _inputs(p):
    torch.manual_seed(p.get("seed", 0))  # the same draw on every rank: the full problem
    dtype = DTYPES[p.get("dtype", "bf16")]
    heads, heads_kv, d = p.get("heads", 2), p.get("heads_kv", p.get("heads", 2)), p.get("dim", 16)
    lead = (p["tokens"],) if "cu" in p else (p.get("batch", 1), p["seqlen"])
    q = torch.randn(*lead, heads, d, dtype=dtype)
    k, v = (torch.randn(*lead, heads_kv, d, dtype=dtype) for _ in range(2))
    return tuple(t.to(DEVICE) for t in (q, k, v, torch.randn_like(q)))


def _cu(p):
    return torch.tensor(p["cu"], dtype=torch.int32, device=DEVICE)


def _groups(p):
    """(the group the call takes, the ring group or None) and how to shard / unshard over them."""
    if p.get("variant") == "usp":
        ug, rg = ulysses_ring_groups(p["ulysses"])
        layers = [(p["layout"], rg), ("contiguous", ug)]
        return ug, rg, layers
    return None, None, [(p["layout"], None)]


def _shard(x, layers, dim):
    for layout, g in layers:
        x = shard(x, layout, g, dim)
    return x


def _unshard(x, layers, dim):
    for layout, g in reversed(layers):
        x = unshard(x, layout, g, dim)
    return x


def _run(p, q, k, v, dout):
    """This rank's out, lse and gradients, gathered back into full tensors."""
    varlen = "cu" in p
    dim = 0 if varlen else 1
    group, ring_group, layers = _groups(p)
    local = [_shard(t, layers, dim).detach().requires_grad_() for t in (q, k, v)]
    kw = dict(causal=p.get("causal", False), layout=p["layout"], window_size=p.get("window", (-1, -1)),
              softcap=p.get("softcap", 0.0), deterministic=p.get("deterministic", False), return_lse=True,
              cu_seqlens=_cu(p) if varlen else None)
    if p.get("variant", "ring") == "ring":
        out, lse = ring_attention(*local, group, **kw)
    else:
        out, lse = ulysses_attention(*local, group, ring_group=ring_group, **kw)
    out.backward(_shard(dout, layers, dim))
    grads = [_unshard(t.grad, layers, dim) for t in local]
    return _unshard(out.detach(), layers, dim), _unshard(lse, layers, -1), grads


def _single(p, q, k, v, dout, window):
    """Single-process flash_attn_func on the whole sequence: the errors the ring is compared with."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    kw = dict(causal=p.get("causal", False), window_size=window, softcap=p.get("softcap", 0.0))
    if "cu" in p:
        cu = _cu(p)
        n = int((cu[1:] - cu[:-1]).max())
        out = flash_attn_varlen_func(*leaves, cu, cu, n, n, **kw)
    else:
        out = flash_attn_func(*leaves, **kw)
    out.backward(dout)
    return out.detach(), [t.grad for t in leaves]


def attention_case(name, p, rank):
    q, k, v, dout = _inputs(p)
    out, lse, grads = _run(p, q, k, v, dout)
    if rank != 0:
        return {"ok": True}
    triton = dispatch.use_triton(q.device)  # the Triton kernels (interpreted) rather than the CPU path
    window = normalize_window(p.get("window", (-1, -1)), p.get("causal", False))
    ref = dict(window=window, softcap=p.get("softcap", 0.0))
    if "cu" in p:
        cu = _cu(p)
        assert_varlen_sequences(name, q, k, v, dout, out, lse, grads, cu, cu, lse_atol=2e-3, **ref)
        end = p["cu"][-1]  # tokens after the last sequence: no output, no gradient
        assert (out[end:] == 0).all() and torch.isneginf(lse[:, end:]).all() and (grads[0][end:] == 0).all(), name
        errors = {}
    else:
        oracles = attention_oracles(q, k, v, dout, **ref)
        assert_matches_oracles(name, out, grads, oracles)
        assert_lse_close(name, lse, oracles["lse64"].float(), atol=2e-3)
        single_out, single_grads = _single(p, q, k, v, dout, window)
        errors = {"out": (max_err(out, oracles["out64"]), max_err(single_out, oracles["out64"]),
                          max_err(oracles["out_t"], oracles["out64"]))}
        for g_name, g, g1, g64, gt in zip(("dq", "dk", "dv"), grads, single_grads, oracles["grads64"],
                                          oracles["grads_t"]):
            errors[g_name] = (max_err(g, g64), max_err(g1, g64), max_err(gt, g64))
    # errors: tensor name -> (this run's, single process', PyTorch's) max error against float64
    return {"ok": True, "errors": errors, "triton": triton}


def deterministic_case(name, p, rank):
    """Two backward passes of one call with deterministic=True give bitwise equal gradients."""
    q, k, v, dout = _inputs(p)
    runs = [_run(dict(p, deterministic=True), q, k, v, dout)[2] for _ in range(2)]
    same = all(torch.equal(a, b) for a, b in zip(*runs))
    return {"ok": same, "message": "" if same else f"{name}: gradients differ between two runs"}


# ---- bad input: every rank must raise, the same exception ----

def error_case(name, p, rank):
    q, k, v, _ = _inputs(p)
    kw = dict(causal=p.get("causal", False), layout=p.get("layout", "contiguous"))
    bad = p["bad"]
    if bad == "shapes":  # rank 1's shard is shorter
        q, k, v = (t[:, : t.shape[1] - 2 * rank] for t in (q, k, v))
    elif bad == "dtype_on_one_rank":
        q = q.to(torch.float64) if rank == 0 else q
    elif bad == "window_differs":
        kw["window_size"] = (4 + rank, 0)
    elif bad == "device":  # a device the group cannot serve: meta for Gloo, the CPU for NCCL
        q, k, v = (t.to("cpu" if DEVICE.type == "cuda" else "meta") for t in (q, k, v))
    elif bad == "unshard_shapes":
        try:
            unshard(q[:, : q.shape[1] - rank], "contiguous")
        except Exception as e:  # noqa: BLE001 - the exception is what is recorded
            return {"ok": True, "raised": type(e).__name__, "message": str(e)}
        return {"ok": True, "raised": None}
    fn = ulysses_attention if p.get("variant") == "ulysses" else ring_attention
    try:
        fn(q, k, v, None, **kw)
    except Exception as e:  # noqa: BLE001
        return {"ok": True, "raised": type(e).__name__, "message": str(e)}
    return {"ok": True, "raised": None}


def _attn(**p):
    return (attention_case, p)


# the same problem on 2 and 4 ranks: test_error_does_not_grow_with_world_size
SAME_ON_2_AND_4 = _attn(layout="zigzag", causal=True, seqlen=64, heads=4, heads_kv=2, dim=32, seed=7)

RING_2 = {
    "zigzag_causal_gqa": SAME_ON_2_AND_4,
    "contiguous_causal_gqa": _attn(layout="contiguous", causal=True, batch=2, seqlen=48, heads=4, heads_kv=2),
    "zigzag_causal": _attn(layout="zigzag", causal=True, seqlen=64, heads=2, dim=32),
    "zigzag_noncausal_fp32": _attn(layout="zigzag", seqlen=40, dtype="fp32"),
    "zigzag_window_softcap": _attn(layout="zigzag", causal=True, seqlen=64, window=(12, 0), softcap=5.0),
    "contiguous_band": _attn(layout="contiguous", seqlen=64, window=(9, 5)),
    "varlen_zigzag_causal": _attn(layout="zigzag", causal=True, tokens=96, cu=[0, 10, 50, 51, 90], heads=4,
                                  heads_kv=1),
    "varlen_contiguous": _attn(layout="contiguous", tokens=64, cu=[0, 5, 40, 64], window=(6, 6)),
    "ulysses_causal_gqa": _attn(variant="ulysses", layout="contiguous", causal=True, seqlen=48, heads=4, heads_kv=2),
    "ulysses_zigzag_varlen_mqa": _attn(variant="ulysses", layout="zigzag", causal=True, tokens=64, cu=[0, 30, 60],
                                       heads=2, heads_kv=1),
    "deterministic": (deterministic_case, dict(layout="zigzag", causal=True, seqlen=32)),
}

RING_4 = {
    "zigzag_causal_gqa": SAME_ON_2_AND_4,
    "contiguous_causal_window": _attn(layout="contiguous", causal=True, seqlen=64, window=(10, 0)),
    "varlen_zigzag_causal": _attn(layout="zigzag", causal=True, tokens=96, cu=[0, 10, 50, 51, 90], heads=4,
                                  heads_kv=1),
    "ulysses_contiguous": _attn(variant="ulysses", layout="contiguous", seqlen=32, heads=4),
    "ulysses2_ring2_zigzag_causal": _attn(variant="usp", ulysses=2, layout="zigzag", causal=True, seqlen=64,
                                          heads=2),
}

ERRORS_2 = {name: (error_case, dict(dict(seqlen=16, bad=bad), **extra)) for name, bad, extra in (
    ("shapes", "shapes", {}),
    ("dtype_on_one_rank", "dtype_on_one_rank", {}),
    ("window_differs", "window_differs", {}),
    ("device", "device", {}),
    ("zigzag_odd_shard", "none", dict(layout="zigzag", seqlen=15)),
    ("ulysses_heads", "none", dict(variant="ulysses", heads=3)),
    ("unshard_shapes", "unshard_shapes", {}),
)}

INTERPRETED_2 = {
    "zigzag_causal_gqa": _attn(layout="zigzag", causal=True, seqlen=32, heads=4, heads_kv=2, dtype="fp32"),
    "varlen_contiguous_window": _attn(layout="contiguous", causal=True, tokens=32, cu=[0, 9, 30], window=(5, 0),
                                      dtype="fp32"),
}

# on GPUs: lengths at which the Hopper kernels take the ring's block calls (views into the shards,
# windows relative to each call, packed calls)
GPU_2 = {
    "zigzag_causal_d128": _attn(layout="zigzag", causal=True, seqlen=4096, heads=4, heads_kv=2, dim=128),
    "contiguous_d64": _attn(layout="contiguous", seqlen=4096, heads=4, dim=64, batch=2),
    "zigzag_window_softcap_d128": _attn(layout="zigzag", causal=True, seqlen=4096, heads=2, dim=128,
                                        window=(700, 0), softcap=20.0),
    "varlen_zigzag_causal_d128": _attn(layout="zigzag", causal=True, tokens=4096, cu=[0, 1000, 3100, 3101, 4000],
                                       heads=4, heads_kv=1, dim=128),
    "ulysses_causal_d128": _attn(variant="ulysses", layout="zigzag", causal=True, seqlen=4096, heads=4, dim=128),
    "deterministic": (deterministic_case, dict(layout="zigzag", causal=True, seqlen=4096, heads=2, dim=128)),
}

SUITES = {"ring2": RING_2, "ring4": RING_4, "errors2": ERRORS_2, "interpreted2": INTERPRETED_2, "gpu2": GPU_2}


def launch(suite, world, out_dir, interpret=False, cuda=False, timeout=240):
    """Start ``world`` processes running ``suite`` and return each rank's results (a dict a case).
    Raises AssertionError naming the suite if a process fails or the suite outlasts ``timeout``
    seconds (a hang fails the test instead of the run)."""
    env = child_env()
    env.update(TRITON_INTERPRET="1" if interpret else "0", OMP_NUM_THREADS="1")
    argv = [sys.executable, str(pathlib.Path(__file__).resolve()), suite, "", str(world), str(out_dir)]
    argv += ["--cuda"] if cuda else []
    procs = []
    for r in range(world):
        argv[3] = str(r)
        procs.append(subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise AssertionError(f"suite {suite} on {world} processes did not finish in {timeout} s") from None
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} of suite {suite} exited {p.returncode}:\n{log[-3000:]}"
    return [json.loads((pathlib.Path(out_dir) / f"rank{r}.json").read_text()) for r in range(world)]


def main():
    global DEVICE
    suite, rank, world, out_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), pathlib.Path(sys.argv[4])
    cuda = "--cuda" in sys.argv[5:]
    if cuda:
        torch.cuda.set_device(rank)
        DEVICE = torch.device("cuda", rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{out_dir / 'store'}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120 if cuda else 60))
    results = {}
    for name, (case, params) in SUITES[suite].items():
        try:
            results[name] = case(name, params, rank)
        except Exception:  # noqa: BLE001 - recorded for the test to report
            results[name] = {"ok": False, "message": traceback.format_exc()}
        dist.barrier()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()  # every process done before any tears the group down (Gloo can abort otherwise)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
