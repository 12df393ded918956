"""Context parallelism (``ioattn.distributed``) over Gloo: 2 and 4 processes started here, each
running ``tests/distributed_worker.py``. Output, lse and gradients of ring and all-to-all attention
against the float64 oracle on the gathered sequence (twice PyTorch's own same-dtype error), causal
and not, zig-zag, windows, softcap, packed sequences, GQA / MQA, Ulysses over a ring; bad input
raising the same error on every rank. The schedule itself (``ioattn.plan.ring``) is checked cell by
cell against the global mask without processes."""
import json
import pathlib
import random
import re
import subprocess
import sys

import pytest
import torch
from conftest import child_env
from distributed_worker import launch

from ioattn.plan import ring as plan

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT_S = 240  # a whole suite; a hang fails the test instead of the run

# one test a suite (a suite is one set of processes), each reporting every case that failed


def assert_ok(results):
    failed = [f"{case} (rank {r}): {res.get('message', '')}" for r, cases in enumerate(results)
              for case, res in cases.items() if not res["ok"]]
    assert not failed, "\n".join(failed)


def assert_error_bounded(results, world):
    """One problem (zig-zag causal GQA, bf16, the worker's ``SAME_ON_2_AND_4``) on 2 and 4 ranks: every tensor's
    error against the float64 oracle is within the single-process kernels' own bound, twice the
    larger of single-process flash_attn_func's error and PyTorch's same-dtype error, which does not
    depend on the world size."""
    for name, (ring, single, torch_err) in results[0]["zigzag_causal_gqa"]["errors"].items():
        assert ring <= 2 * max(single, torch_err), \
            f"{world} ranks, {name}: {ring:.3e} against single process {single:.3e}, PyTorch {torch_err:.3e}"


def test_two_processes(tmp_path):
    """Ring (both layouts, causal and not, windows, softcap, packed, GQA / MQA, deterministic) and
    all-to-all attention on 2 Gloo processes against the oracle and one process."""
    results = launch("ring2", 2, tmp_path, timeout=TIMEOUT_S)
    assert_ok(results)
    assert_error_bounded(results, 2)


def test_four_processes(tmp_path):
    """4 Gloo processes: ring, all-to-all, and all-to-all over a ring (2 x 2); the error bound of the
    problem also run on 2 (the error does not grow with the world size)."""
    results = launch("ring4", 4, tmp_path, timeout=TIMEOUT_S)
    assert_ok(results)
    assert_error_bounded(results, 4)


def test_two_processes_on_the_triton_kernels(tmp_path):
    """The ring's block calls (strided views, packed calls) through the Triton kernels, interpreted."""
    from ioattn import _compat

    problem = _compat.interpreter_numpy_problem()
    if problem:  # (the device machines' numpy): every interpreted call is refused there, and said why
        pytest.skip(problem)
    results = launch("interpreted2", 2, tmp_path, interpret=True, timeout=TIMEOUT_S)
    assert_ok(results)
    assert all(res["triton"] for res in results[0].values()), "a case ran on the CPU path, not the Triton kernels"


EXPECTED_ERRORS = {
    "shapes": ("ValueError", "every rank must pass the same q shape"),
    "dtype_on_one_rank": ("TypeError", "refused on rank 0"),
    "window_differs": ("ValueError", "every rank must pass the same window_size"),
    "device": ("ValueError", "cannot serve"),
    "zigzag_odd_shard": ("ValueError", "two equal chunks"),
    "ulysses_heads": ("ValueError", "cannot share equally"),
    "unshard_shapes": ("ValueError", "every rank must pass the same shard shape"),
}


def assert_raised_alike(results):
    """Every rank raised each case's expected exception, with one message a case."""
    assert set(results[0]) == set(EXPECTED_ERRORS)
    for case, (kind, text) in EXPECTED_ERRORS.items():
        for r, res in enumerate(results):
            assert res[case]["raised"] == kind, f"{case}, rank {r}: {res[case]}"
            assert text in res[case]["message"], f"{case}, rank {r}: {res[case]['message']}"
        messages = {res[case]["message"] for res in results}
        assert len(messages) == 1, f"{case}: the ranks raised different messages: {messages}"


def test_bad_input_raises_on_every_rank(tmp_path):
    """Shards of different shapes, a dtype refused on one rank, different windows, a device the
    backend cannot serve, an odd zig-zag shard, heads the all-to-all cannot share, unshard of
    different shapes: the same exception on every rank, none hangs."""
    assert_raised_alike(launch("errors2", 2, tmp_path, timeout=TIMEOUT_S))


def test_refused_without_a_process_group():
    from ioattn.distributed import ring_attention, shard

    q = torch.randn(1, 8, 2, 16)
    for call in (lambda: ring_attention(q, q, q), lambda: shard(q)):
        with pytest.raises(RuntimeError, match="not initialised"):
            call()


def _torchrun(args):
    """``torchrun --standalone --nproc-per-node 2 ARGS`` (a free port of its own), on the CPU path (no GPU
    visible: two ranks on one card would be refused by NCCL)."""
    env = child_env()
    env.update(TRITON_INTERPRET="0", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"torchrun {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_example_trains_with_two_processes():
    """examples/train_context_parallel.py as documented: the sharded model's loss and gradients equal
    one process's on the whole sequences, then a few training steps."""
    out = _torchrun(["examples/train_context_parallel.py", "--steps", "3", "--seqlen", "64"])
    m = re.search(r"loss differs by (\S+), gradients by (\S+)", out)
    assert m and float(m[1]) < 1e-4 and float(m[2]) < 1e-4, out
    assert "step   2" in out, out


def test_benchmark_runs_under_torchrun(tmp_path):
    """The GPU benchmark's entry point, on the CPU at a tiny shape: a record per provider, timed and
    matching the single-device output."""
    _torchrun(["-m", "ioattn.bench.context_parallel", "--device", "cpu", "--seqlen", "64", "--headdim", "16",
               "--nheads", "2", "--dtype", "fp32", "--reps", "1", "--warmup", "0", "--causal", "1",
               "--providers", "ioattn-ring,ioattn-ring-zigzag,ioattn-ulysses", "--out", str(tmp_path)])
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert {r["provider"] for r in records} == {"ioattn-single-device", "ioattn-ring", "ioattn-ring-zigzag",
                                                "ioattn-ulysses"}
    for r in records:
        assert r["ok"] and r["ms"] > 0 and r["world_size"] == 2 and r["ratio_to_single"] > 0, r


# ---- the schedule, without processes ----

def _mask_cells(layout, world, local, window, sequences):
    """The global mask's cells (query, key) whose query rank r holds, per rank."""
    left, right = window
    seq_of = {}
    for n, (a, b) in enumerate(sequences or ((0, world * local),)):
        seq_of.update({t: n for t in range(a, b)})
    want = []
    for r in range(world):
        mine = plan.positions(layout, world, r, local)
        want.append({(p, t) for p in mine for t in range(world * local)
                     if p in seq_of and seq_of.get(t) == seq_of[p] and (left < 0 or t >= p - left)
                     and (right < 0 or t <= p + right)})
    return want


def _call_cells(call):
    """(local row, local column) of each cell the kernel computes for ``call``."""
    left, right = call.window
    out, i0, j0 = [], call.rows[0], call.cols[0]
    for sq, sk in call.seqlens or ((call.rows[1] - i0, call.cols[1] - j0),):
        for i in range(sq):
            for j in range(sk):
                diag = i + sk - sq
                if (left < 0 or j >= diag - left) and (right < 0 or j <= diag + right):
                    out.append((i0 + i, j0 + j))
        i0, j0 = i0 + sq, j0 + sk
    return out


def test_schedule_computes_every_visible_cell_once():
    """Every rank's calls over all ring steps cover exactly its rows of the global mask, each cell once:
    both layouts, 1 to 4 ranks, causal, bands, one-sided windows, packed sequences with a tail."""
    rng = random.Random(0)
    for layout in plan.LAYOUTS:
        for world in (1, 2, 3, 4):
            for window in ((-1, -1), (-1, 0), (3, 0), (2, 1), (0, 0), (5, -1), (-1, 2)):
                total = world * 6
                cuts = sorted(rng.sample(range(1, total), 3))
                for sequences in (None, tuple(zip([0] + cuts, cuts + [total - 1]))):
                    want = _mask_cells(layout, world, 6, window, sequences)
                    for r in range(world):
                        rows = plan.positions(layout, world, r, 6)
                        got = []
                        for s, calls in enumerate(plan.schedule(layout, world, r, 6, window, sequences)):
                            cols = plan.positions(layout, world, (r - s) % world, 6)
                            got += [(rows[i], cols[j]) for call in calls for i, j in _call_cells(call)]
                        where = f"{layout} world {world} rank {r} window {window} sequences {sequences}"
                        assert len(got) == len(set(got)), f"{where}: a cell computed twice"
                        assert set(got) == want[r], f"{where}: cells differ from the mask"


@pytest.mark.parametrize("world", [2, 4, 8])
def test_zigzag_causal_balances_the_ranks(world):
    """Zig-zag causal: every rank computes the same cells at every step, in one call a step; the
    contiguous layout's last rank does all the work while rank 0 does one diagonal."""
    local = 64
    work = [[sum(plan.cells(c) for c in calls) for calls in plan.schedule("zigzag", world, r, local, (-1, 0))]
            for r in range(world)]
    assert all(w == work[0] for w in work), work
    assert all(len(calls) == 1 for r in range(world) for calls in plan.schedule("zigzag", world, r, local, (-1, 0)))
    contiguous = [sum(plan.cells(c) for calls in plan.schedule("contiguous", world, r, local, (-1, 0)) for c in calls)
                  for r in range(world)]
    assert contiguous[-1] > contiguous[0] * (world - 1) and sum(contiguous) == sum(map(sum, work))


def test_a_short_window_shortens_the_ring():
    """A causal window of fewer tokens than a shard: two steps of the ring, whatever the world size."""
    assert len(plan.schedule("contiguous", 8, 3, 64, (20, 0))) == 2
    assert len(plan.schedule("contiguous", 8, 3, 64, (-1, 0))) == 8
