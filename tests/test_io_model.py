"""The IO model of attention (``ioattn.reference.io_model``) and ``ioattn io``: byte counts against
cases counted by hand, the paper's asymptotics, causal block counts against a brute-force count of
the mask, GQA, the command line and its errors."""
import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from ioattn import cli
from ioattn.masks import keep_mask
from ioattn.reference import io_model as m
from conftest import child_env, run_cli

TILE = m.Tiles(2, 2)


def _terms(x):
    return dict(x.terms)


# ---- by hand: N = 4, d = 2, one head ----

def test_standard_forward_by_hand():
    x = m.standard_forward(m.Problem(4, 2, dtype="bf16"))
    mat, scores = 4 * 2 * 2, 4 * 4 * 2  # a 4 x 2 matrix of 2-byte elements; a 4 x 4 one
    assert _terms(x) == {"Q": (mat, 0), "K": (mat, 0), "S": (scores, scores), "P": (scores, scores), "V": (mat, 0),
                         "O": (0, mat)}
    assert (x.read, x.written, x.bytes) == (112, 80, 192)  # reads 3 x 16 + 2 x 32, writes 2 x 32 + 16
    assert x.flops == 4 * 2 * 4 * 4


def test_standard_backward_by_hand():
    x = m.standard_backward(m.Problem(4, 2, dtype="bf16"))
    mat, scores = 16, 32
    assert _terms(x) == {"P": (2 * scores, 0), "dO": (2 * mat, 0), "V": (mat, 0), "dP": (scores, scores),
                         "dS": (2 * scores, scores), "K": (mat, 0), "Q": (mat, 0), "dQ": (0, mat), "dK": (0, mat),
                         "dV": (0, mat)}
    assert x.flops == 8 * 2 * 16


def test_fa2_forward_by_hand():
    p = m.Problem(4, 2, dtype="fp32")
    mat = 4 * 2 * 4  # 32 bytes
    # two query blocks of 2 rows, each reading both key blocks: 2 x 4 key rows of K (and of V)
    assert _terms(m.fa2_forward(p, TILE)) == {"Q": (mat, 0), "K": (2 * mat, 0), "V": (2 * mat, 0), "O": (0, mat),
                                              "lse": (0, 4 * 4)}
    causal = m.fa2_forward(m.Problem(4, 2, dtype="fp32", causal=True), TILE)
    # query block 0 sees key block 0 (2 rows), query block 1 sees both (4 rows): 6 key rows of 8 bytes
    assert causal.terms["K"] == causal.terms["V"] == (6 * 2 * 4, 0)
    assert causal.flops == 4 * 2 * (2 * 2 + 2 * 4)


def test_fa1_forward_by_hand():
    p = m.Problem(4, 2, dtype="fp32")
    # 4 (key block, query block) visits of 2 query rows: 8 query rows of 8 bytes each moved per visit
    assert _terms(m.fa1_forward(p, TILE)) == {
        "Q": (8 * 8, 0), "K": (32, 0), "V": (32, 0), "O": (0, 32), "O partial": (8 * 8, 8 * 8),
        "l, m": (2 * 8 * 4, 2 * (4 + 8) * 4)}  # l and m: zeroed (4 rows), then read and written per visit
    causal = m.fa1_forward(m.Problem(4, 2, dtype="fp32", causal=True), TILE)
    # visits (query block, key block): (0, 0), (1, 0), (1, 1): 6 query rows
    assert _terms(causal) == {"Q": (48, 0), "K": (32, 0), "V": (32, 0), "O": (0, 32), "O partial": (48, 48),
                              "l, m": (2 * 6 * 4, 2 * (4 + 6) * 4)}


def test_tiled_backward_by_hand():
    p = m.Problem(4, 2, dtype="fp32")
    acc = (32 + 8 * 8, 8 * 8 + 32)  # dQ in fp32: zeroed, then read and written per visit (8 rows), read to convert
    shared = {"K": (32, 0), "V": (32, 0), "Q": (64, 0), "dQ accumulator": acc, "dQ": (0, 32), "dK": (0, 32),
              "dV": (0, 32)}
    # FA2: D = rowsum(dO * O) first (O and dO read once, D written), then dO, lse and D per visit
    assert _terms(m.fa2_backward(p, TILE)) == {**shared, "dO": (32 + 64, 0), "O": (32, 0), "D": (8 * 4, 4 * 4),
                                               "lse": (8 * 4, 0)}
    # FA1: O, dO, l and m per visit
    assert _terms(m.fa1_backward(p, TILE)) == {**shared, "dO": (64, 0), "O": (64, 0), "l, m": (2 * 8 * 4, 0)}
    assert m.fa2_backward(p, TILE).flops == 10 * 2 * 16


def test_minimum_by_hand():
    p = m.Problem(4, 2, dtype="fp32", causal=True)
    assert _terms(m.minimum_forward(p)) == {"Q": (32, 0), "K": (32, 0), "V": (32, 0), "O": (0, 32), "lse": (0, 16)}
    assert m.minimum_forward(p).flops == 4 * 2 * (1 + 2 + 3 + 4)  # row i sees i + 1 keys
    back = m.minimum_backward(p)
    assert back.read == 5 * 32 + 16 and back.written == 3 * 32 and back.flops == 10 * 2 * 10


def test_rectangular_causal_by_hand():
    # 5 queries, 2 keys, bottom-right: rows 0-2 see nothing, row 3 key 0, row 4 keys 0 and 1
    assert m.visits(5, 2, TILE, True) == m.Visits(pairs=2, rows=2 + 1, cols=2 + 2, area=4 + 2, keys_seen=2)
    assert m.visible_pairs(5, 2, True) == 3
    # 2 queries, 5 keys: row 0 sees keys 0-3, row 1 all five; key blocks of 2, 2 and 1 rows
    assert m.visits(2, 5, TILE, True) == m.Visits(pairs=3, rows=6, cols=5, area=10, keys_seen=5)
    assert m.visible_pairs(2, 5, True) == 9


def test_time_bound_by_hand():
    toy = m.Device("toy", 100.0, {"bf16": 10.0}, 4096, 0, "made up")
    # standard forward above: 192 bytes, 128 FLOPs: 1.92 s of memory, 12.8 s of compute
    row = m.predict(m.Problem(4, 2), toy).figures(m.standard_forward(m.Problem(4, 2)))
    assert row["bound"] == "compute" and row["time_s"] == pytest.approx(12.8) and row["memory_s"] == pytest.approx(1.92)
    assert row["intensity"] == pytest.approx(128 / 192) and row["vs_standard"] == 1.0
    slow = m.Device("slow", 10.0, {"bf16": 10.0}, 4096, 0, "made up")
    assert m.predict(m.Problem(4, 2), slow).as_dict()["rows"][0]["predicted"]["bound"] == "memory"


# ---- the paper's asymptotics ----

def test_standard_scores_grow_as_n_squared():
    for n in (256, 1024, 4096):
        small, big = (m.standard_forward(m.Problem(s, 64)) for s in (n, 2 * n))
        for term in ("S", "P"):
            assert sum(big.terms[term]) == 4 * sum(small.terms[term])


@pytest.mark.parametrize("sram", [64 * 1024, 228 * 1024])
def test_tiled_bytes_scale_as_n2_d2_over_m(sram):
    """FA2 reads K and V (2 N d e bytes) once per query block of M / 4de rows: 8 N² d² e² / M. FA1 moves
    Q and O (3 d e bytes a row) and l, m (16) once per key block: (12 + 64 / de) N² d² e² / M. The
    other terms and the floor in the tile sizes add at most 12.5 % over this sweep."""
    for d in (32, 64, 128):
        for n in (8192, 16384, 32768, 65536):
            p = m.Problem(n, d)
            unit = n * n * d * d * 2 * 2 / sram
            fa2 = m.fa2_forward(p, m.choose_tiles("q", d, 2, sram)).bytes / unit
            fa1 = m.fa1_forward(p, m.choose_tiles("kv", d, 2, sram)).bytes / unit
            assert 8 <= fa2 <= 8 * 1.125, (d, n, fa2)
            assert 1 <= fa1 / (12 + 64 / (d * 2)) <= 1.125, (d, n, fa1)


def test_tiled_attention_moves_less_than_standard():
    pred = m.predict(m.Problem(4096, 128, nheads=8))
    for direction in m.PASSES:
        std, fa1, fa2, low = (pred.find(a, direction).bytes for a in m.ALGORITHMS)
        assert low < fa2 < fa1 < std, direction


# ---- causal block counts against the mask ----

def _brute_visits(nq, nk, tiles, causal):
    keep = keep_mask(nq, nk, (-1, 0) if causal else (-1, -1))
    pairs = rows = cols = area = 0
    seen = set()
    for i in range(0, nq, tiles.block_m):
        for j in range(0, nk, tiles.block_n):
            block = keep[i:i + tiles.block_m, j:j + tiles.block_n]
            if block.any():
                pairs, rows, cols, area = pairs + 1, rows + block.shape[0], cols + block.shape[1], area + block.numel()
                seen |= set(range(j, j + block.shape[1]))
    return m.Visits(pairs, rows, cols, area, len(seen)), int(keep.sum())


@pytest.mark.parametrize("causal", [False, True])
def test_block_counts_equal_a_brute_force_count(causal):
    for nq in range(1, 10):
        for nk in range(1, 10):
            for bm in range(1, 5):
                for bn in range(1, 5):
                    tiles = m.Tiles(bm, bn)
                    expected, kept = _brute_visits(nq, nk, tiles, causal)
                    assert m.visits(nq, nk, tiles, causal) == expected, (nq, nk, bm, bn)
                    assert m.visible_pairs(nq, nk, causal) == kept, (nq, nk)


def test_causal_halves_the_tiled_work_at_length():
    full, half = (m.visits(8192, 8192, m.Tiles(128, 64), c) for c in (False, True))
    assert full.area == 8192 * 8192 and 0.5 < half.area / full.area < 0.51


# ---- GQA ----

def test_gqa():
    mha, gqa = m.Problem(4, 2, nheads=4, dtype="fp32"), m.Problem(4, 2, nheads=4, nheads_kv=2, dtype="fp32")
    assert m.minimum_forward(gqa).terms["K"] == (2 * 32, 0)  # one read per KV head
    assert m.minimum_forward(mha).terms["K"] == (4 * 32, 0)
    assert m.fa2_forward(gqa, TILE).terms == m.fa2_forward(mha, TILE).terms  # K, V streamed per query head
    back = m.fa2_backward(gqa, TILE)
    assert back.terms["K"] == (2 * 32, 0) and back.terms["dK"] == (0, 2 * 32) and back.terms["Q"] == (4 * 64, 0)
    # standard: dK, dV per query head (4 x 32 bytes each), then summed into 2 KV heads
    assert m.standard_backward(gqa).terms["dK, dV group sum"] == (2 * 4 * 32, 2 * 2 * 32)
    assert "dK, dV group sum" not in m.standard_backward(mha).terms


# ---- tiles ----

def test_tiles_from_the_on_chip_memory():
    # 228 KiB of bf16 at d = 128: floor(233472 / (4 * 128 * 2)) = 228 rows
    assert m.choose_tiles("kv", 128, 2, 233472) == m.Tiles(128, 228)
    assert m.choose_tiles("q", 128, 2, 233472) == m.Tiles(228, 128)
    # block_m given: block_n shrinks to the room left, 233472 / (2 * 128 * 2) - 300 = 156
    tiles = m.choose_tiles("kv", 128, 2, 233472, block_m=300)
    assert tiles == m.Tiles(300, 156) and m.footprint(tiles, 128, 2) == 233472
    for sram in (1024, 5000, 65536, 233472):
        for d in (8, 64, 96, 200):
            for elem in (1, 2, 4):
                if sram >= 4 * d * elem:
                    for outer in ("kv", "q"):
                        assert m.footprint(m.choose_tiles(outer, d, elem, sram), d, elem) <= sram


# ---- bad input ----

@pytest.mark.parametrize("kwargs, argument", [
    (dict(seqlen_q=0), "seqlen_q"), (dict(seqlen_k=-1), "seqlen_k"), (dict(headdim=0), "headdim"),
    (dict(batch=0), "batch"), (dict(nheads=6, nheads_kv=4), "nheads"), (dict(nheads_kv=0), "nheads_kv"),
    (dict(dtype="fp64"), "dtype"), (dict(seqlen_q=2.5), "seqlen_q"), (dict(causal=1), "causal"),
])
def test_bad_problem(kwargs, argument):
    with pytest.raises(m.ModelArgumentError) as e:
        m.Problem(**{"seqlen_q": 64, "headdim": 64, **kwargs})
    assert e.value.argument == argument and str(e.value).startswith(argument)


@pytest.mark.parametrize("kwargs, argument, words", [
    (dict(block_m=0), "block_m", "got 0"), (dict(block_n=-4), "block_n", "got -4"),
    (dict(block_m=300, block_n=200), "block_m", "more than sram=233472"),
    (dict(block_n=456), "block_n", "block_n=456"), (dict(sram=1023), "sram", "1024 bytes, got 1023"),
    (dict(sram=0), "sram", "got 0"), (dict(device="a100"), "device", "h100, h200"),
])
def test_bad_tiles_sram_or_device(kwargs, argument, words):
    with pytest.raises(m.ModelArgumentError) as e:
        m.predict(m.Problem(64, 128), **kwargs)
    assert e.value.argument == argument and words in str(e.value)


# ---- the command line ----

_exit = run_cli


def test_io_json_as_a_module():
    argv = ["--seqlen", "1000", "--headdim", "64", "--nheads", "4", "--nheads-kv", "2", "--causal", "--json"]
    done = subprocess.run([sys.executable, "-m", "ioattn", "io", *argv], capture_output=True, text=True,
                          env=child_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["problem"] == dict(batch=1, nheads=4, nheads_kv=2, seqlen_q=1000, seqlen_k=1000, headdim=64,
                                   dtype="bf16", causal=True, in_bytes=2, out_bytes=2, stat_bytes=4)
    assert data["device"]["sram"] == 228 * 1024 and data["device"]["name"] == "NVIDIA H100 SXM"
    rows = {(r["algorithm"], r["pass"]): r for r in data["rows"]}
    assert set(rows) == {(a, d) for a in m.ALGORITHMS for d in m.PASSES}
    expected = m.predict(m.Problem(1000, 64, nheads=4, nheads_kv=2, causal=True)).as_dict()
    assert data["rows"] == json.loads(json.dumps(expected["rows"]))
    fa2 = rows[("fa2", "forward")]
    assert fa2["tiles"] == {"block_m": 456, "block_n": 64}  # floor(233472 / (4 * 64 * 2)), and min(456, d)
    got = fa2["predicted"]
    assert got["bytes"] == got["read"] + got["written"] == sum(sum(t.values()) for t in got["terms"].values())
    assert set(got) >= {"vs_standard", "flops", "intensity", "time_s", "bound"}


def test_io_table(capsys):
    code, out, err = _exit(["io", "--seqlen", "2048", "--headdim", "128", "--block-m", "128", "--block-n", "64",
                            "--device", "h200"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.startswith("pass"))
    for column in ("bytes", "vs standard", "FLOPs", "FLOP/B", "bound", "time >="):
        assert column in header
    body = [ln.split() for ln in lines if ln.split()[:1] in (["forward"], ["backward"])]
    assert [(r[0], r[1]) for r in body] == [(d, a) for d in m.PASSES for a in m.ALGORITHMS]
    assert all(r[2] == "128x64" for r in body if r[1] in ("fa1", "fa2"))
    assert "NVIDIA H200" in out and "no cache" in out


def test_io_fp8_is_forward_only(capsys):
    code, out, _ = _exit(["io", "--seqlen", "512", "--headdim", "64", "--dtype", "fp8", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and {r["pass"] for r in data["rows"]} == {"forward"}
    assert data["problem"]["in_bytes"] == 1 and data["problem"]["out_bytes"] == 2 and "forward only" in data["notes"][0]


def test_top_level_help_lists_io(capsys):
    code, out, _ = _exit(["--help"], capsys)
    assert code == 0 and any(ln.split()[:1] == ["io"] for ln in out.splitlines())


@pytest.mark.parametrize("argv, words", [
    (["--seqlen", "0", "--headdim", "64"], "--seqlen must be a positive integer, got 0"),
    (["--seqlen", "64", "--headdim", "-8"], "--headdim must be a positive integer, got -8"),
    (["--seqlen", "64", "--headdim", "64", "--seqlen-k", "0"], "--seqlen-k must be a positive integer, got 0"),
    (["--seqlen", "64", "--headdim", "64", "--block-n", "0"], "--block-n must be a positive integer, got 0"),
    (["--seqlen", "64", "--headdim", "64", "--nheads", "6", "--nheads-kv", "4"], "--nheads must be a multiple"),
    (["--seqlen", "64", "--headdim", "128", "--block-m", "512", "--block-n", "512"], "--block-m does not fit"),
    (["--seqlen", "64", "--headdim", "128", "--sram", "1000"], "--sram must hold"),
    (["--seqlen", "64", "--headdim", "64", "--device", "a100"], "--device"),
    (["--headdim", "64"], "--seqlen"),
])
def test_io_bad_input_is_a_clear_error(argv, words, capsys):
    code, out, err = _exit(["io", *argv], capsys)
    assert code == 2 and out == "" and words in err, err


# ---- measured bytes (Nsight Compute): what runs without a GPU ----

NCU_REPORT = '''==PROF== Connected to process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python","h","attn_fwd","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Mbyte","1,234.50"
"0","4242","python","h","attn_fwd","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","Kbyte","512"
"1","4242","python","h","fill","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","100"
"1","4242","python","h","fill","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","28"
'''


def test_ncu_report_sums_every_kernel_in_bytes():
    from ioattn.bench import io_measure

    got = io_measure.parse_report(NCU_REPORT)
    assert got == {"read": 1_234_500_000 + 100, "written": 512_000 + 28, "bytes": 1_234_500_000 + 100 + 512_000 + 28,
                   "kernels": 2}
    with pytest.raises(io_measure.MeasureError, match="no kernel"):
        io_measure.parse_report("==PROF== No kernels were profiled.\n")


def test_ncu_command_profiles_one_call_of_the_problem():
    from ioattn.bench import io_measure

    p = m.Problem(2048, 128, seqlen_k=4096, batch=2, nheads=8, nheads_kv=2, dtype="fp16", causal=True)
    cmd = io_measure.ncu_command("ncu", io_measure.child_args(p, "ioattn", "backward"))
    assert cmd[:4] == ["ncu", "--csv", "--profile-from-start", "off"]
    assert ",".join(io_measure.METRICS) in cmd and cmd[cmd.index("-m") + 1] == "ioattn.bench.io_measure"
    args = cmd[cmd.index("-m") + 2:]
    assert args == ["--impl", "ioattn", "--direction", "backward", "--seqlen", "2048", "--seqlen-k", "4096",
                    "--headdim", "128", "--batch", "2", "--nheads", "8", "--nheads-kv", "2", "--dtype", "fp16",
                    "--causal"]


def test_measure_at_the_models_tiles_fixes_the_portable_kernels_tiles(monkeypatch, capsys):
    """``--measure`` with ``--block-m`` and ``--block-n``: ioattn's child runs at those tiles (the math
    path's does not), the measured row names them; tiles the kernels cannot take are refused first."""
    from ioattn.bench import io_measure
    from ioattn.plan import dispatch

    calls = []

    def fake(problem, impl, direction, tiles=None):
        calls.append((impl, direction, tiles))
        return {"read": 10, "written": 5, "bytes": 15, "kernels": 1}
    monkeypatch.setattr(io_measure, "measure", fake)
    assert cli.main(["io", "--seqlen", "1024", "--headdim", "64", "--block-m", "64", "--block-n", "128",
                     "--measure", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {c[2] for c in calls} == {(64, 128)} and len(calls) == 4
    fa2 = next(r for r in rows if r["algorithm"] == "fa2" and r["pass"] == "forward")
    assert fa2["measured"]["kernel_tiles"] == [64, 128] and fa2["tiles"]["block_n"] == 128
    assert "kernel_tiles" not in next(r for r in rows if r["algorithm"] == "standard")["measured"]
    p = m.Problem(1024, 64)
    assert io_measure.child_args(p, "ioattn", "forward", (64, 128))[-2:] == ["--tiles", "64,128"]
    calls.clear()  # lists of tiles: every combination a point, each measured at its own
    assert cli.main(["io", "--seqlen", "1024", "--headdim", "64", "--block-m", "64,128", "--block-n", "64",
                     "--measure", "--json"]) == 0
    points = json.loads(capsys.readouterr().out)
    assert [next(r for r in p["rows"] if r["algorithm"] == "fa2")["tiles"]["block_m"] for p in points] == [64, 128]
    assert sorted({c[2] for c in calls}) == [(64, 64), (128, 64)]
    with pytest.raises(SystemExit):
        cli.main(["io", "--seqlen", "1024", "--headdim", "64", "--block-m", "96", "--block-n", "64", "--measure"])
    assert "--block-m with --measure: the kernels take powers of two from 16 to 256, got 96" in capsys.readouterr().err
    before = dict(dispatch._override)
    io_measure._fix_tiles(64, 32, 64)  # the child's override: the tiles, the head dim's warps and stages
    try:
        for kind in ("fwd", "bwd"):
            got = dispatch.tiles(kind, 64, torch.device("cuda"))
            assert (got.block_m, got.block_n) == (32, 64) and dispatch.tiles_overridden(kind, 64)
    finally:
        dispatch._override.clear()
        dispatch._override.update(before)


def test_committed_measurements_are_io_records_with_both_rows_measured():
    """Every committed ``ioattn io --measure`` results file (records with ``rows``): each point's
    standard and fa2 rows measured in both passes, bytes = read + written, the ratio to the model's
    count as stored."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    files = [f for f in sorted(root.glob("**/results.jsonl")) if '"rows"' in f.read_text()[:2000]]
    assert files
    for path in files:
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            got = [r for r in rec["rows"] if "measured" in r]
            assert {(r["pass"], r["algorithm"]) for r in got} == {(p, a) for p in ("forward", "backward")
                                                                   for a in ("standard", "fa2")}, path
            for r in got:
                mm = r["measured"]
                assert mm["bytes"] == mm["read"] + mm["written"] > 0
                assert mm["vs_predicted"] == pytest.approx(mm["bytes"] / r["predicted"]["bytes"])


def test_measure_without_ncu_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "")
    assert cli.main(["io", "--seqlen", "256", "--headdim", "64", "--measure"]) == 1
    err = capsys.readouterr().err
    assert "ioattn io --measure: Nsight Compute (ncu) is not on PATH" in err


def test_a_sweep_prints_each_point_and_writes_records_and_a_plot(tmp_path, capsys):
    """``--seqlen`` / ``--headdim`` lists: one table a point, ``--json`` a list, ``--out`` the records (each
    the single point's object) and a plot; a bad size anywhere refuses the whole sweep first."""
    argv = ["io", "--seqlen", "256,512", "--headdim", "32,64", "--nheads", "2", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("IO model of attention") == 4
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["problem"]["headdim"], r["problem"]["seqlen_q"]) for r in records] == [(32, 256), (32, 512),
                                                                                      (64, 256), (64, 512)]
    assert all(r["command"] == "ioattn " + " ".join(argv) for r in records)
    single = m.predict(m.Problem(512, 64, nheads=2)).as_dict()
    assert records[3]["rows"] == single["rows"]
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "io_model.png").stat().st_size > 0
    assert cli.main(["io", "--seqlen", "256,512", "--headdim", "64", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
    with pytest.raises(SystemExit):
        cli.main(["io", "--seqlen", "256,0", "--headdim", "64", "--out", str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()


def test_a_tile_sweep_at_one_call_is_plotted_against_the_tile_size(tmp_path):
    """One call at several tile sizes: the plot's x axis is the tile size (one fa2 point each, in
    block_m then block_n order), standard and the minimum as lines beside them."""
    pytest.importorskip("matplotlib")
    from ioattn.bench import io_command

    argv = ["io", "--seqlen", "512", "--headdim", "64", "--block-m", "64,32", "--block-n", "32,64", "--out",
            str(tmp_path)]
    assert cli.main(argv) == 0
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    fa2 = [r for rec in records for r in rec["rows"] if r["algorithm"] == "fa2" and r["pass"] == "forward"]
    assert sorted(io_command._tile_pair(r) for r in fa2) == [(32, 32), (32, 64), (64, 32), (64, 64)]
    assert (tmp_path / "io_model.png").stat().st_size > 0
    from matplotlib.figure import Figure
    ax = Figure().add_subplot()
    pts = [(512, 1, r) for rec in records for r in rec["rows"] if r["pass"] == "forward"]
    io_command._plot_tiles(ax, pts)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["32x32", "32x64", "64x32", "64x64"]
    model = ax.get_lines()[0].get_ydata()
    assert list(model) == [r["predicted"]["bytes"] for r in sorted(fa2, key=io_command._tile_pair)]
