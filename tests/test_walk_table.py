"""The persistent forward's host-built causal walk (``gluon_fwd.build_walk_table``, the kernel's ``Walk``;
docs/decisions/persistent-causal-walk.md): a permutation of every tile in the kernel's encoding, each program's
walk in group order, balanced in the cost model better than the computed walks it replaces. Pure Python, no GPU."""

import pytest
import torch

from ioattn.plan import hopper
from ioattn.launch import gluon_fwd
from ioattn.plan import forward


def _walks(table, programs):
    """table -> (steps, {program: its tiles, in order, up to the first 'no tile'}), num_tiles unknown."""
    steps = table[0]
    rows = [table[1 + k * programs: 1 + (k + 1) * programs] for k in range(steps + 1)]
    return steps, rows


def _causal_kv_tiles(num_m, seqlen_q=None, seqlen_k=None, block_m=128, block_n=128):
    seqlen_q = seqlen_q or num_m * block_m
    seqlen_k = seqlen_k or seqlen_q
    return tuple(forward._kv_tiles(m * block_m, seqlen_q, seqlen_k, block_m, block_n) for m in range(num_m))


def _cost(kv, t, bh_count, tile_cost=hopper.WALK_TABLE_TILE_COST):
    num_m = len(kv)
    return tile_cost + max(0, kv[num_m - 1 - t // bh_count])


@pytest.mark.parametrize("programs,batch_heads,num_m,group", [
    (132, 512, 8, 64), (132, 1024, 4, 128), (132, 256, 16, 32), (7, 10, 5, 3), (132, 3, 2, 1), (4, 1, 9, 4)])
def test_walk_table_is_every_tile_once(programs, batch_heads, num_m, group):
    """Every tile j * batch_heads + bh exactly once; past a walk's end and in the extra last row only
    num_tiles ('no tile'); no tile after a 'no tile' in a walk; steps the longest walk."""
    kv = _causal_kv_tiles(num_m)
    table = gluon_fwd.build_walk_table(programs, batch_heads, kv, group, hopper.WALK_TABLE_TILE_COST)
    num_tiles = batch_heads * num_m
    steps, rows = _walks(table, programs)
    assert len(table) == 1 + (steps + 1) * programs
    assert all(t == num_tiles for t in rows[steps])
    seen = []
    longest = 0
    for p in range(programs):
        walk = [rows[k][p] for k in range(steps + 1)]
        n = walk.index(num_tiles)
        assert all(t == num_tiles for t in walk[n:]), walk
        seen += walk[:n]
        longest = max(longest, n)
    assert sorted(seen) == list(range(num_tiles))
    assert longest == steps


def test_walk_table_groups_and_lpt_order():
    """Each program's walk visits the groups of heads in turn and, within a group, no tile longer
    than the one before it (the LPT order the greedy assignment keeps)."""
    programs, bh_count, num_m, group = 132, 512, 8, 64
    kv = _causal_kv_tiles(num_m)
    table = gluon_fwd.build_walk_table(programs, bh_count, kv, group, hopper.WALK_TABLE_TILE_COST)
    steps, rows = _walks(table, programs)
    num_tiles = bh_count * num_m
    for p in range(programs):
        walk = [rows[k][p] for k in range(steps) if rows[k][p] != num_tiles]
        groups = [(t % bh_count) // group for t in walk]
        assert groups == sorted(groups), groups
        for a, b in zip(walk, walk[1:]):
            if (a % bh_count) // group == (b % bh_count) // group:
                assert _cost(kv, a, bh_count) >= _cost(kv, b, bh_count)


def _makespan_table(table, programs, kv, bh_count):
    steps, rows = _walks(table, programs)
    num_tiles = bh_count * len(kv)
    return max(sum(_cost(kv, rows[k][p], bh_count) for k in range(steps) if rows[k][p] != num_tiles)
               for p in range(programs))


def _makespan_snake_lpt(programs, kv, bh_count):
    """The computed causal walk (``hopper_tiles._walk`` with SNAKE, ``_tile_bhm``'s LPT order)."""
    num_tiles = bh_count * len(kv)
    work = [0.0] * programs
    for k in range(-(-num_tiles // programs)):
        for p in range(programs):
            t = k * programs + (programs - 1 - p if k % 2 else p)
            if t < num_tiles:
                work[p] += _cost(kv, t, bh_count)
    return max(work)


@pytest.mark.parametrize("bh_count,num_m", [(1024, 4), (512, 8), (256, 16)])
def test_walk_table_balance(bh_count, num_m):
    """At 16k tokens (bf16, d = 64: 4096 tiles of 128 rows) on 132 programs: the table's longest
    modelled walk within one tile of the ideal (the work over the programs), and shorter than the
    computed LPT walk's (the last wave's remainder on part of the programs)."""
    programs = 132
    kv = _causal_kv_tiles(num_m)
    group = hopper.walk_group_heads(2 * num_m * 128 * 64 * 2, 64)
    table = gluon_fwd.build_walk_table(programs, bh_count, kv, group, hopper.WALK_TABLE_TILE_COST)
    ideal = sum(_cost(kv, t, bh_count) for t in range(bh_count * num_m)) / programs
    ours = _makespan_table(table, programs, kv, bh_count)
    assert ours <= ideal + max(_cost(kv, t, bh_count) for t in range(bh_count * num_m))
    assert ours < _makespan_snake_lpt(programs, kv, bh_count)
    # within 1.4 % of the ideal with d = 64's 4 MB groups (the model's balance with 16 MB ones: 1 %)
    assert ours / ideal < 1.015, ours / ideal


def test_walk_table_rows_past_the_keys():
    """seqlen_q > seqlen_k (causal, bottom-right aligned): query blocks that see no key cost the
    fixed cost only and are still walked (their rows get output 0 and lse -inf)."""
    kv = _causal_kv_tiles(6, seqlen_q=6 * 128, seqlen_k=200)
    assert kv[0] <= 0 and kv[-1] == 2
    table = gluon_fwd.build_walk_table(5, 3, kv, 2, hopper.WALK_TABLE_TILE_COST)
    steps, rows = _walks(table, 5)
    assert sorted(t for k in range(steps) for t in rows[k] if t != 18) == list(range(18))


def test_walk_group_heads():
    """Heads a group: as many as fit their K / V bytes in the head dim's WALK_TABLE_L2_BYTES, at
    least one; every head dim the table fits has a budget."""
    assert set(hopper.WALK_TABLE_FITS) <= set(hopper.WALK_TABLE_L2_BYTES)
    for d in hopper.WALK_TABLE_FITS:
        assert hopper.walk_group_heads(hopper.WALK_TABLE_L2_BYTES[d] // 64, d) == 64
        assert hopper.walk_group_heads(hopper.WALK_TABLE_L2_BYTES[d] * 3, d) == 1
        assert hopper.walk_group_heads(0, d) >= 1
    # d = 64's budget is the smaller (docs/decisions/persistent-causal-walk.md): the same bytes a head make smaller
    # groups there
    assert hopper.walk_group_heads(1 << 20, 64) < hopper.walk_group_heads(1 << 20, 128)


def test_walk_table_policy(monkeypatch):
    """Only the persistent kernel's causal calls at d = 64 / 128 (d = 256 spills with it); forced by
    hopper.walk_table, else from WALK_TABLE_MIN_BLOCKS query blocks; where it is on, the paired walk
    is off (the table holds LPT-encoded tiles)."""
    with hopper.walk_table(True):
        assert hopper.walk_table_for(64, "persistent", True) and hopper.walk_table_for(128, "persistent", True)
        assert not hopper.walk_table_for(256, "persistent", True)
        assert not hopper.walk_table_for(64, "persistent", False)
        assert not hopper.walk_table_for(64, "pingpong", True)
        assert not hopper.persistent_options(128, "persistent", True, 4)["PAIRED"]
    with hopper.walk_table(False):
        assert not any(hopper.walk_table_for(d, "persistent", True) for d in (64, 128, 256))
        assert hopper.persistent_options(128, "persistent", True, 4)["PAIRED"]
    assert all(d in hopper.WALK_TABLE_FITS for d in hopper.WALK_TABLE_MIN_BLOCKS)
    # unset: at every length at d = 64 / 128 (4 MB groups at d = 64 from N = 512,
    # docs/decisions/persistent-causal-walk.md)
    assert hopper.walk_table_for(128, "persistent", True, 4) and hopper.walk_table_for(64, "persistent", True, 4)
    assert hopper.walk_table_for(64, "persistent", True, 1) and hopper.walk_table_for(64, "persistent", True)
    # a threshold in WALK_TABLE_MIN_BLOCKS: from that many query blocks only
    monkeypatch.setitem(hopper.WALK_TABLE_MIN_BLOCKS, 64, 8)
    assert not hopper.walk_table_for(64, "persistent", True, 4) and hopper.walk_table_for(64, "persistent", True, 8)
    assert hopper.walk_table_for(64, "persistent", True)  # no length given: any length it covers
    assert not hopper.persistent_options(128, "persistent", True, 4)["PAIRED"]
    assert hopper.persistent_options(64, "persistent", True, 16)["PAIRED"] is False
    with hopper.paired_walk(True):  # the pairs asked for, the table not: the pairs
        assert not hopper.walk_table_for(128, "persistent", True, 4)
        assert hopper.persistent_options(128, "persistent", True, 4)["PAIRED"]
        with hopper.walk_table(True):  # both asked for: the table
            assert not hopper.persistent_options(128, "persistent", True, 4)["PAIRED"]


def test_walk_table_tensor_cached():
    """One int32 tensor a shape, the same object on the next call; the table's values."""
    kv = _causal_kv_tiles(4)
    a = gluon_fwd.walk_table_tensor(torch.device("cpu"), 6, 5, kv, 2, hopper.WALK_TABLE_TILE_COST)
    b = gluon_fwd.walk_table_tensor(torch.device("cpu"), 6, 5, kv, 2, hopper.WALK_TABLE_TILE_COST)
    assert a is b and a.dtype == torch.int32
    assert a.tolist() == gluon_fwd.build_walk_table(6, 5, kv, 2, hopper.WALK_TABLE_TILE_COST)
    assert gluon_fwd.walk_table_tensor(torch.device("cpu"), 6, 5, kv, 3, hopper.WALK_TABLE_TILE_COST) is not a
