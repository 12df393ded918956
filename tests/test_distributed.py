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

from ioattn.plan import ring as plan

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "distributed_worker.py"
TIMEOUT_S = 240  # a whole suite; a hang fails the test instead of CI


@pytest.fixture(scope="module")
def suites(tmp_path_factory):
    """Each suite runs once, on first use; the tests below read its per-case results."""
    done = {}

    def get(suite, world, interpret=False):
        if suite not in done:
            done[suite] = launch(suite, world, tmp_path_factory.mktemp(suite), interpret, timeout=TIMEOUT_S)
        return done[suite]
    return get


sys.path.insert(0, str(WORKER.parent))
from distributed_worker import ERRORS_2, INTERPRETED_2, RING_2, RING_4, launch  # noqa: E402


def assert_ok(results, case):
    for r, res in enumerate(results):
        assert res[case]["ok"], f"rank {r}: {res[case].get('message', '')}"


@pytest.mark.parametrize("case", list(RING_2))
def test_two_ranks(suites, case):
    assert_ok(suites("ring2", 2), case)


@pytest.mark.parametrize("case", list(RING_4))
def test_four_ranks(suites, case):
    assert_ok(suites("ring4", 4), case)


def test_error_does_not_grow_with_world_size(suites):
    """One problem (zig-zag causal GQA, bf16) on 2 and 4 ranks: at both, every tensor's error against
    the float64 oracle is within the single-process kernels' own bound, twice the larger of
    single-process flash_attn_func's error and PyTorch's same-dtype error, a bound that does not
    depend on the world size."""
    for world, suite in ((2, "ring2"), (4, "ring4")):
        errors = suites(suite, world)[0]["zigzag_causal_gqa"]["errors"]
        for name, (ring, single, torch_err) in errors.items():
            assert ring <= 2 * max(single, torch_err), \
                f"{world} ranks, {name}: {ring:.3e} against single process {single:.3e}, PyTorch {torch_err:.3e}"


@pytest.mark.parametrize("case", list(INTERPRETED_2))
def test_two_ranks_on_the_triton_kernels(suites, case):
    """The ring's block calls (strided views, packed calls) through the Triton kernels, interpreted."""
    results = suites("interpreted2", 2, interpret=True)
    assert_ok(results, case)
    assert results[0][case]["triton"], "the case ran on the CPU path, not the Triton kernels"


EXPECTED_ERRORS = {
    "shapes": ("ValueError", "every rank must pass the same q shape"),
    "dtype_on_one_rank": ("TypeError", "refused on rank 0"),
    "window_differs": ("ValueError", "every rank must pass the same window_size"),
    "device": ("ValueError", "cannot serve"),
    "zigzag_odd_shard": ("ValueError", "two equal chunks"),
    "ulysses_heads": ("ValueError", "cannot share equally"),
    "unshard_shapes": ("ValueError", "every rank must pass the same shard shape"),
}


def assert_raised_alike(results, case):
    """Every rank raised the expected exception, with one message."""
    kind, text = EXPECTED_ERRORS[case]
    messages = {res[case].get("message") for res in results}
    for r, res in enumerate(results):
        assert res[case]["raised"] == kind, f"rank {r}: {res[case]}"
        assert text in res[case]["message"], f"rank {r}: {res[case]['message']}"
    assert len(messages) == 1, f"the ranks raised different messages: {messages}"


@pytest.mark.parametrize("case", list(ERRORS_2))
def test_bad_input_raises_on_every_rank(suites, case):
    assert_raised_alike(suites("errors2", 2), case)


def test_refused_without_a_process_group():
    from ioattn.distributed import ring_attention, shard

    q = torch.randn(1, 8, 2, 16)
    for call in (lambda: ring_attention(q, q, q), lambda: shard(q)):
        with pytest.raises(RuntimeError, match="not initialised"):
            call()


def _torchrun(args):
    """``torchrun --standalone --nproc-per-node 2 ARGS`` (a free port of its own), on the CPU path."""
    env = child_env()
    env.update(TRITON_INTERPRET="0", OMP_NUM_THREADS="1")
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
