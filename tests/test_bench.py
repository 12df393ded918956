"""``ioattn bench``: FLOP counts, the record schema, and the report (tables, plots, command line).

CPU only: the real sweeps are the small CPU "quick" and "decode" sweeps (ioattn's CPU path vs
PyTorch's CPU attention), each run once per module; everything about the report runs on a hand-made file in
tests/data (and decode records made from it)."""
import functools
import json
import os
import pathlib
import statistics

import pytest
import torch

from conftest import DEVICE
from ioattn.plan import dispatch
from ioattn.bench import report
from ioattn.bench.providers import calibrate_unified_max, decode_providers, paged_copy
from ioattn.bench import run as bench_run
from ioattn.bench.run import DECODE_ROUNDS, decode_bytes, run_sweep
from ioattn.bench.timing import attention_flops

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "bench_fixture.jsonl")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---- FLOP counts ----

@pytest.mark.parametrize("shape, causal, mode, flops", [
    # 4 * B * H * Sq * Sk * D, written out
    ((2, 3, 128, 128, 64), False, "fwd", 4 * 2 * 3 * 128 * 128 * 64),
    ((2, 3, 128, 128, 64), False, "fwd", 25_165_824),
    ((2, 3, 128, 128, 64), True, "fwd", 12_582_912),      # halved when causal
    ((2, 3, 128, 128, 64), False, "bwd", 62_914_560),     # 2.5x forward
    ((2, 3, 128, 128, 64), True, "bwd", 31_457_280),
    ((2, 3, 128, 128, 64), False, "fwdbwd", 88_080_384),  # 3.5x forward
    ((1, 32, 1, 4096, 128), False, "fwd", 67_108_864),    # decode-like: Sq != Sk
    ((8, 16, 2048, 2048, 128), True, "fwdbwd", 481_036_337_152),
])
def test_attention_flops(shape, causal, mode, flops):
    assert attention_flops(*shape, causal, mode) == flops


# ---- schema ----

def _cpu_sweep(name, **kwargs):
    """(records, log lines) of a CPU sweep as the CLI runs it. conftest sets TRITON_INTERPRET=1 for the
    kernel tests, which would send the sweep through Triton's interpreter (minutes); `ioattn bench` on
    a CPU runs the CPU path (ioattn.kernels.cpu), so do that, on one thread (tiny tensors: intra-op threads only
    add waiting on a loaded machine)."""
    lines = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with dispatch.forced_backend("reference"):
            records = run_sweep(name, "cpu", log=lines.append, **kwargs)
    finally:
        torch.set_num_threads(threads)
    return records, lines


@pytest.fixture(scope="module")
def cpu_quick():
    return _cpu_sweep("quick", headdims=[64], seqlens=[64, 128], rounds=1)


def test_cpu_quick_sweep_records_are_valid(cpu_quick):
    records, lines = cpu_quick
    assert records, lines
    for r in records:
        assert report.validate(r) == [], r
    assert {r["provider"] for r in records} == {"ioattn", "sdpa", "sdpa-math"}
    assert {r["mode"] for r in records} == {"fwd", "bwd"}
    ours = [r for r in records if r["provider"] == "ioattn"]
    assert all(r["ok"] and r["tflops"] > 0 for r in ours), [r.get("error") for r in ours]
    assert lines and all(isinstance(ln, str) for ln in lines)  # progress goes to the log callback
    # and the report reads them: both providers in the table, one row per (causal, seqlen, mode)
    text = report.table(records)
    assert "ioattn" in text and "sdpa-math" in text and "vs sdpa-math" in text
    assert len(report.ratio_rows(records)) == 2 * 2 * 2
    # each provider checked once per configuration (causal or not), its verdict in the log and the records
    assert sum(ln.startswith("check ") for ln in lines) == 3 * 2
    assert all(r["max_err"] <= r["err_bound"] for r in records)

    # each record names the sources it timed, so that an A/B over two copies of the package shows which ran
    assert {r["env"]["ioattn"] for r in records} == {bench_run.source_digest()}


def test_source_digest_follows_the_sources(tmp_path):
    import shutil
    import ioattn
    copy = tmp_path / "ioattn"
    shutil.copytree(pathlib.Path(ioattn.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert bench_run.source_digest(copy) == bench_run.source_digest()
    with open(copy / "api.py", "a") as f:
        f.write("\n# changed\n")
    assert bench_run.source_digest(copy) != bench_run.source_digest()


def _good():
    with open(FIXTURE) as f:
        return json.loads(f.readline())


@pytest.mark.parametrize("change, expect", [
    (lambda r: r.pop("seqlen_k"), "missing field 'seqlen_k'"),
    (lambda r: r.pop("ok"), "missing field 'ok'"),
    (lambda r: r.update(mode="forward"), "unknown mode 'forward'"),
    (lambda r: r.update(dtype="float32"), "unknown dtype 'float32'"),
    (lambda r: r.update(batch="32"), "'batch' is str"),
    (lambda r: r.update(causal=1), "'causal' is int"),
    (lambda r: r.update(headdim=True), "'headdim' is bool"),
    (lambda r: r.update(tflops="fast"), "'tflops' is str"),
    (lambda r: r.pop("tflops"), "none of tflops, gbps, peak_mem_mb"),
])
def test_validate_catches(change, expect):
    r = _good()
    assert report.validate(r) == []
    change(r)
    problems = report.validate(r)
    assert any(expect in p for p in problems), problems


def test_validate_accepts_nulls_and_other_metrics():
    r = dict(_good(), ms=None, tflops=None, ok=False, error="could not run")
    assert report.validate(r) == []
    r = {k: v for k, v in _good().items() if k != "tflops"}
    assert report.validate(dict(r, mode="decode", gbps=3100.0)) == []
    assert report.validate(dict(r, mode="memory", peak_mem_mb=None)) == []
    assert report.validate([1, 2]) == ["not a JSON object"]
    assert set(report.REQUIRED_FIELDS) >= {"sweep", "provider", "mode", "dtype", "ms", "ok", "device"}


def test_load(tmp_path):
    recs = report.load(FIXTURE)
    assert len(recs) == 29 and all(report.validate(r) == [] for r in recs)
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(recs[0]) + "\n\n   \n" + json.dumps(recs[1]) + "\n")
    assert report.load(p) == recs[:2]  # blank lines skipped
    p.write_text(json.dumps(recs[0]) + "\n\n{\"sweep\": \n")
    with pytest.raises(ValueError, match=r":3: malformed JSON"):
        report.load(p)


# ---- report ----

def test_table_shows_every_provider():
    text = report.table(report.load(FIXTURE))
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.split()[:2] == ["d", "causal"] and "sdpa-flash" in ln)
    for p in ("ioattn", "sdpa-flash", "sdpa-efficient", "flash-attn", "ioattn / best peer",
              "ioattn % of bf16 matmul"):
        assert p in header
    rows = [ln.split() for ln in lines if ln.split()[:1] == ["64"]]
    assert len(rows) == 2 * 2 * 2  # causal x seqlen x mode
    cols = header.split()
    eff, fa = cols.index("sdpa-efficient"), cols.index("flash-attn")
    assert all(r[eff] == "fail" and r[fa] == "n/a" for r in rows)  # never silently dropped
    # the reasons are printed too
    assert "failed the correctness check" in text and "flash_attn not importable" in text
    # causal=no, seqlen 1024, fwd: 349.1 vs sdpa-flash 289.7 -> 1.21, 349.1 / 796 -> 44%
    first = rows[0]
    assert first[:4] == ["64", "no", "1024", "fwd"]
    assert "349.1" in first and "1.21" in first and "sdpa-flash" in first and "44%" in first
    assert "peak MB" in text  # the memory record gets its own section
    only_bwd = report.table(report.load(FIXTURE), mode="bwd")
    assert " fwd " not in only_bwd and " bwd " in only_bwd


def test_ratio_rows():
    train = [r for r in report.load(FIXTURE) if r["sweep"] == "train"]
    rows = report.ratio_rows(train)
    assert len(rows) == 8
    d, causal, n, mode, ours, name, best, ratio = rows[0]
    assert (d, causal, n, mode, name) == (64, False, 1024, "fwd", "sdpa-flash")
    assert ours == pytest.approx(349.1, abs=0.1) and best == pytest.approx(289.7, abs=0.1)
    assert ratio == pytest.approx(ours / best)
    with pytest.raises(ValueError, match="several"):
        report.ratio_rows(report.load(FIXTURE))  # train + memory mixed


@pytest.mark.parametrize("shape, kept", [
    ((1, 512, 8, 64), (1, 512, 8, 64)),        # the CPU quick sweep's first point: checked whole
    ((16, 1024, 32, 64), (2, 1024, 32, 64)),   # the GPU quick sweep's: two sequences, every head
    ((1, 8192, 8, 64), (1, 8192, 1, 64)),      # long: one head, 2**26 score entries
    ((4, 16384, 16, 128), (2, 16384, 1, 128)),  # past the budget even at one head: never zero heads
])
def test_check_slice_bounds_the_oracle(shape, kept):
    q = torch.empty(shape)
    assert all(t.shape == kept for t in bench_run._check_slice(q, q, q))


def test_ratio_columns_and_summaries():
    """A ``vs PEER`` column per peer (its time over ioattn's at that row), one summary line per peer,
    and the correctness summary from the records' verdict fields."""
    train = [r for r in report.load(FIXTURE) if r["sweep"] == "train"]
    lines = report.table(train).splitlines()
    header = next(ln for ln in lines if ln.split()[:2] == ["d", "causal"])
    assert "vs sdpa-flash" in header and "vs sdpa-efficient" not in header  # no ratio to a failed peer
    ours, peer = (next(r for r in train if r["provider"] == p and r["mode"] == "fwd" and not r["causal"]
                       and r["seqlen_q"] == 1024) for p in ("ioattn", "sdpa-flash"))
    assert f"{peer['ms'] / ours['ms']:.2f}" in lines[2]
    assert report.ratio_summary(train) == [
        "ioattn vs sdpa-flash (train, bf16): ioattn is as fast or faster at 6 of 8 points; ratio median 1.09, "
        "range 0.91 to 1.35",
        "(ratio = the peer's time / ioattn's at the same point: > 1 means ioattn is faster)"]
    assert report.check_summary(train) == ""  # records from before the verdict fields
    checked = [dict(train[0], err_bound=1e-3, ok=True), dict(train[0], provider="sdpa-flash", causal=True,
                                                             err_bound=1e-3, ok=False)]
    line = report.check_summary(checked)
    assert line.startswith("correctness: FAIL: 1 of 2 checks pass (ioattn 1/1, sdpa-flash 0/1); "
                           "failed: sdpa-flash d=64 causal=1; bound: 2 x PyTorch")


def test_plot_writes_pngs(tmp_path):
    pytest.importorskip("matplotlib")  # the optional [bench] extra
    paths = report.plot(report.load(FIXTURE), str(tmp_path))
    assert sorted(os.path.basename(p) for p in paths) == ["memory_bf16.png", "train_bf16_bwd.png",
                                                          "train_bf16_fwd.png"]
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        assert data[:8] == PNG_MAGIC and len(data) > 5000


def test_memory_records_labelled_by_pass(tmp_path):
    pytest.importorskip("matplotlib")  # the optional [bench] extra
    # the memory sweep may record the pass it measured ("fwdbwd") as mode: still a memory figure
    mem = [r for r in report.load(FIXTURE) if r["sweep"] == "memory"][0]
    recs = [dict(mem, mode="fwdbwd"), dict(mem, mode="fwdbwd", provider="sdpa-math", peak_mem_mb=4096.0)]
    assert all(report.validate(r) == [] for r in recs)
    text = report.table(recs)
    assert "peak MB" in text and "1024" in text and "4096" in text and "0.25 sdpa-math" in text
    assert [os.path.basename(p) for p in report.plot(recs, str(tmp_path))] == ["memory_bf16.png"]


def test_main(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # the optional [bench] extra
    assert report.main([FIXTURE, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "sdpa-efficient" in out and out.count("wrote ") == 3
    assert len(list(tmp_path.glob("*.png"))) == 3


def test_main_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(open(FIXTURE).readline() + "not json\n")
    assert report.main([str(bad), "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and ":2:" in captured.err
    assert report.main([str(tmp_path / "missing.jsonl")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    # an invalid record is reported with its line and skipped, the rest still goes through
    recs = report.load(FIXTURE)
    broken = {k: v for k, v in recs[1].items() if k != "device"}
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join(json.dumps(r) for r in (recs[0], broken, recs[2])) + "\n")
    assert report.main([str(mixed), "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("skipped") == 1 and ":2:" in captured.err and "'device'" in captured.err
    assert "ioattn" in captured.out


# ---- run_sweep on bad names ----

def test_bad_rounds_is_refused_before_anything_runs(tmp_path, capsys):
    from ioattn.bench.run import main
    with pytest.raises(SystemExit) as e:
        main(["decode", "--rounds", "0", "--out", str(tmp_path / "r")])
    assert e.value.code == 2 and "--rounds must be at least 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_the_command_line_knows_the_decode_peers(tmp_path, capsys):
    """``bench decode --providers flashinfer`` passes the command line's check of provider names (the
    decode sweep's peers, not only the forward's); a name no sweep knows is still refused there."""
    from ioattn.bench.run import main
    with pytest.raises(SystemExit) as e:
        main(["decode", "--providers", "flashinfer,flashinfer-fp8,nope", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unknown provider 'nope'" in err and not (tmp_path / "r").exists()


def test_unknown_sweep_is_a_line_not_an_exception():
    lines = []
    assert run_sweep("no-such-sweep", "cpu", log=lines.append) == []
    assert len(lines) == 1 and "unknown sweep 'no-such-sweep'" in lines[0]


def test_unknown_provider_is_a_line_not_an_exception():
    lines = []
    records = run_sweep("quick", "cpu", provider_names=["no-such-provider"], log=lines.append)
    assert any("no-such-provider" in ln and "unknown provider" in ln for ln in lines), lines
    # still recorded, as could-not-run, so a report shows it as n/a
    assert records and all(not r["ok"] and r["tflops"] is None for r in records)
    assert all(report.validate(r) == [] for r in records)
    assert "n/a" in report.table(records)


def test_hopper_provider_without_hopper_is_a_recorded_refusal():
    """ioattn-hopper on a machine without an sm_90 GPU: each shape is recorded as could-not-run,
    with the reason, and the sweep goes on with the other providers."""
    records, lines = _cpu_sweep("quick", headdims=[64], seqlens=[256], provider_names=["ioattn-hopper", "ioattn"],
                                rounds=1)
    hop = [r for r in records if r["provider"] == "ioattn-hopper"]
    assert hop and all(not r["ok"] and r["tflops"] is None and "sm_90" in r["error"] for r in hop), hop
    assert any(r["provider"] == "ioattn" and r["ok"] for r in records)
    assert all(report.validate(r) == [] for r in records)


# ---- decode ----

@pytest.mark.parametrize("args, nbytes", [
    ((1, 4096, 8, 128, 2), 2 * 1 * 4096 * 8 * 128 * 2),  # K and V, written out
    ((1, 4096, 8, 128, 2), 16_777_216),                   # 16 MiB: the batch-1 step
    ((64, 4096, 8, 128, 2), 1_073_741_824),               # 1 GiB
    ((2, 1024, 2, 64, 4), 2_097_152),                     # fp32 elements
])
def test_decode_bytes(args, nbytes):
    assert decode_bytes(*args) == nbytes


@pytest.fixture(scope="module")
def cpu_decode():
    return _cpu_sweep("decode")


def test_cpu_decode_sweep_records_are_valid(cpu_decode):
    records, lines = cpu_decode
    assert records, lines
    for r in records:
        assert report.validate(r) == [], r
        assert r["mode"] == "decode" and r["seqlen_q"] == 1 and r["causal"] is False
        assert r["paged"] == (r["provider"] == "ioattn-paged")
    assert {"ioattn", "sdpa-math"} <= {r["provider"] for r in records}
    for r in records:
        assert r["ok"] and r["gbps"] > 0 and r["us"] == pytest.approx(1e3 * r["ms"]), r
        itemsize = bench_run.DTYPES[r["dtype"]].itemsize
        nbytes = decode_bytes(r["batch"], r["seqlen_k"], r["nheads_kv"], r["headdim"], itemsize)
        assert r["gbps"] == pytest.approx(nbytes / r["ms"] / 1e6)
    # one record per (provider, case), its time the median of its interleaved rounds
    assert len({(r["provider"], r["batch"], r["seqlen_k"]) for r in records}) == len(records)
    for r in records:
        assert len(r["ms_rounds"]) == DECODE_ROUNDS and r["ms"] == statistics.median(r["ms_rounds"]), r
    text = report.table(records)
    assert "GB/s" in text and "kvlen" in text and "ioattn us" in text
    rows = [ln.split() for ln in text.splitlines() if ln.split()[-1:] in (["sdpa"], ["sdpa-math"])]
    assert len(rows) == len({(r["batch"], r["seqlen_k"]) for r in records})


def test_decode_rounds_interleave_providers(monkeypatch):
    """Every provider is timed once per round, round r starting at provider r; the record holds the
    median of the rounds; a provider that fails in a round is reported and dropped from later ones."""
    calls = []

    def setup(name):
        def make(q, k, v, seqlens):
            def run():
                if name == "c" and calls.count("c") == 1:
                    raise RuntimeError("c broke in round 2")
                return name
            return run
        return make

    def fake_median(fn, sets, stats=None, **_):
        calls.append(fn(sets[0]))
        return {"a": 1.0, "b": 2.0, "c": 3.0}[calls[-1]] + 0.1 * len(calls)

    monkeypatch.setattr(bench_run, "decode_providers", lambda names: {n: (setup(n), "") for n in "abc"})
    monkeypatch.setattr(bench_run, "_check_decode", lambda setup, inputs: (True, 0.0))
    monkeypatch.setattr(bench_run, "median_ms", fake_median)
    lines = []
    records = bench_run.run_decode_sweep("decode", "cpu", provider_names=["a"], log=lines.append,
                                         batches=[1], kvlens=[64], rounds=3)
    # rounds a b c | b (c fails) a | (c dropped) a b
    assert calls == ["a", "b", "c", "b", "a", "a", "b"], calls
    by = {r["provider"]: r for r in records}
    assert set(by) == {"a", "b", "c"} and len(records) == 3
    assert not by["c"]["ok"] and "c broke in round 2" in by["c"]["error"]
    assert by["a"]["ms_rounds"] == pytest.approx([1.1, 1.5, 1.6]) and by["a"]["ms"] == pytest.approx(1.5)
    assert by["b"]["ms_rounds"] == pytest.approx([2.2, 2.4, 2.7]) and by["b"]["ms"] == pytest.approx(2.4)
    assert any("c broke" in ln for ln in lines)


def test_unknown_decode_provider_is_a_line_not_an_exception():
    lines = []
    records = run_sweep("decode", "cpu", provider_names=["no-such-provider"], log=lines.append)
    assert any("no-such-provider" in ln and "unknown decode provider" in ln for ln in lines), lines
    assert records and all(not r["ok"] and r["gbps"] is None for r in records)
    assert all(report.validate(r) == [] for r in records)
    assert "n/a" in report.table(records)
    table = decode_providers(["no-such-provider", "ioattn"])
    assert table["no-such-provider"][0] is None and table["ioattn"][0] is not None
    if not torch.cuda.is_available():
        assert decode_providers(["ioattn-graph"])["ioattn-graph"] == (None, "needs CUDA (CUDA graph replay)")


class _FakeFlashInfer:
    """FlashInfer's batch decode as its documentation defines it (pages of ``page_size`` tokens in NHD
    layout, a sequence's pages ``indices[indptr[b]:indptr[b + 1]]`` in order, ``last_page_len`` tokens of
    its last page; scales multiply the cache's values), computed by the float64 oracle."""

    def __init__(self):
        self.plans = []
        fake = self

        class Wrapper:
            def __init__(self, workspace, layout, use_tensor_cores=False):
                assert layout == "NHD" and workspace.dtype == torch.uint8
                self.tensor_cores = use_tensor_cores

            def plan(self, indptr, indices, last, nheads, hkv, d, page, q_data_type, kv_data_type):
                self.args = (indptr, indices, last, nheads, hkv, d, page)
                fake.plans.append(dict(tensor_cores=self.tensor_cores, kv=kv_data_type))

            def run(self, q, pages, k_scale=1.0, v_scale=1.0):
                from ioattn.reference.decode import kvcache_attention_ref
                indptr, indices, last, nheads, hkv, d, page = self.args
                outs = []
                for b in range(q.shape[0]):
                    ids = indices[int(indptr[b]):int(indptr[b + 1])].long()
                    n = (len(ids) - 1) * page + int(last[b])
                    k, v = (p[ids].reshape(-1, hkv, d)[:n].double() * sc for p, sc in zip(pages, (k_scale, v_scale)))
                    outs.append(kvcache_attention_ref(q[b:b + 1, None].double(), k[None], v[None])[0][0, 0])
                return torch.stack(outs).to(q.dtype)

        self.BatchDecodeWithPagedKVCacheWrapper = Wrapper


@pytest.mark.parametrize("name", ["flashinfer", "flashinfer-fp8"])
def test_flashinfer_decode_peer_builds_its_page_table(name, monkeypatch):
    """The FlashInfer decode peers (``bench decode``'s ``flashinfer``, ``flashinfer-fp8``) against a stand-in
    that computes what FlashInfer's documentation says its arguments mean: the contiguous caches as pages
    in order, partly filled sequences' last pages, tensor cores from four query heads a KV head, e4m3
    caches with one scale a tensor matching their same-precision twin; not importable here: a reason."""
    import sys

    from ioattn.bench.providers import FLASHINFER_PAGE
    from ioattn.reference.decode import kvcache_attention_ref

    import importlib.util
    if importlib.util.find_spec("flashinfer") is None:
        made, why = decode_providers([name])[name]
        assert made is None and "not importable here" in why, why
    fake = _FakeFlashInfer()
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    setup = decode_providers([name])[name][0]
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 1, 8, 16, generator=g)
    k, v = (torch.randn(3, 3 * FLASHINFER_PAGE, 2, 16, generator=g) for _ in range(2))
    lens = torch.tensor([3 * FLASHINFER_PAGE, 70, 1], dtype=torch.int32)
    out = setup(q, k, v, lens)()
    want = (setup.same_precision(q, k, v, lens) if name.endswith("fp8")
            else kvcache_attention_ref(q, k, v, cache_seqlens=lens)[0])
    assert out.shape == q.shape and (out.double() - want.double()).abs().max() < 1e-5
    assert fake.plans == [dict(tensor_cores=True, kv=torch.float8_e4m3fn if name.endswith("fp8") else torch.float32)]
    with pytest.raises(ValueError, match="whole 64-token pages"):
        setup(q, k[:, :100], v[:, :100], lens)


def test_paged_copy_and_calibration():
    k, v = torch.randn(2, 300, 2, 16), torch.randn(2, 300, 2, 16)
    k_pages, v_pages, table = paged_copy(k, v, page_size=128)
    assert k_pages.shape == (6, 128, 2, 16) and table.shape == (2, 3) and table.dtype == torch.int32
    assert sorted(table.flatten().tolist()) == list(range(6)) and table.flatten().tolist() != list(range(6))
    for b in range(2):  # token t of sequence b in page table[b, t // 128], row t % 128
        got = k_pages[table[b].long()].reshape(-1, 2, 16)[:300]
        assert torch.equal(got, k[b]) and torch.equal(v_pages[table[b].long()].reshape(-1, 2, 16)[:300], v[b])
    q = torch.randn(2, 1, 4, 16)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k[:, :64].repeat_interleave(2, dim=2)) / 4.0
    assert calibrate_unified_max(q, k, keys=64) == pytest.approx(scores.max().item(), rel=1e-5)


def _decode_recs():
    base = {k: v for k, v in _good().items() if k not in ("tflops", "max_err")}
    recs = []
    for provider, batch, gbps in (("ioattn", 1, 2000.0), ("sdpa-flash", 1, 1000.0), ("ioattn-graph", 1, 2500.0),
                                  ("ioattn", 64, 3000.0), ("sdpa-flash", 64, 3200.0)):
        nbytes = decode_bytes(batch, 4096, 8, 128, 2)
        ms = nbytes / gbps / 1e6
        recs.append(dict(base, sweep="decode", mode="decode", provider=provider, batch=batch, nheads=32,
                         nheads_kv=8, headdim=128, seqlen_q=1, seqlen_k=4096, ms=ms, us=ms * 1e3, gbps=gbps))
    return recs


def test_report_decode_records(tmp_path):
    recs = _decode_recs()
    assert all(report.validate(r) == [] for r in recs)
    text = report.table(recs)
    assert "== decode sweep, bf16, GB/s" in text and "ioattn % of d2d copy" in text
    header, *rows = [ln.split() for ln in text.splitlines()[1:]]
    assert header[:4] == ["d", "batch", "kvlen", "mode"]
    assert [r[:4] for r in rows] == [["128", "1", "4096", "decode"], ["128", "64", "4096", "decode"]]
    # batch 1: 2000 vs 1000 GB/s -> 2.00, 2000 / 4262.5 -> 47%; 16 MiB at 2500 GB/s -> 6.7 us replayed
    assert "2.00" in rows[0] and "47%" in rows[0] and "6.7" in rows[0] and "8.4" in rows[0]
    assert "0.94" in rows[1] and "-" in rows[1]  # batch 64 has no graph record
    assert [r[3] for r in report.ratio_rows(recs)] == ["decode", "decode"]
    pytest.importorskip("matplotlib")  # the optional [bench] extra
    assert [os.path.basename(p) for p in report.plot(recs, str(tmp_path))] == ["decode_bf16.png"]


def test_readme_table_is_generated_from_committed_results():
    """The performance record's table (docs/performance.md) is the output of ``ioattn.bench.perf_table``
    on the results file it names: a hand edit (or a stale table after new results) fails here."""
    import pathlib
    import re

    from ioattn.bench import perf_table as mod

    root = pathlib.Path(__file__).resolve().parents[1]
    readme = (root / "docs" / "performance.md").read_text()
    block = readme.split(mod.START, 1)[1].split(mod.END, 1)[0].strip()
    sources = re.findall(r"head dim [0-9, ]+: `([^`]+)`", block.split("\n", 1)[0])
    assert sources, "the caption names no results file"
    assert block == _in_root(mod.table, root, sources)


def _in_root(render, root, paths):
    """Render with paths relative to the repository root (as the README names them)."""
    import os
    here = os.getcwd()
    try:
        os.chdir(root)
        return render(paths)
    finally:
        os.chdir(here)


def test_committed_results_follow_the_schema():
    """Every committed results file of the ``ioattn bench`` sweeps passes the documented record schema, so the
    report command can always re-render them."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    files = sorted(root.glob("**/results.jsonl"))
    assert files
    for path in files:
        records = report.load(str(path))
        assert records, path
        if "study" in records[0]:  # the accuracy studies' own schema: tests/test_fp8_study.py
            continue
        if "rows" in records[0]:  # ``ioattn io``'s records: tests/test_io_model.py
            continue
        problems = {i: report.validate(r) for i, r in enumerate(records) if report.validate(r)}
        assert not problems, f"{path}: {dict(list(problems.items())[:3])}"


def test_packed_layout_reaches_every_provider(monkeypatch):
    """``--layout qkvpacked``: every provider gets q, k, v as the views of one (batch, seqlen, 3,
    heads, d) tensor, checked and timed on the same sets, and every record says so; a layout it does
    not know is a line, not an exception."""
    seen = []

    def fake_time(fn, sets, causal, mode, stats=None, timer=None):
        q, k, v = sets[0]
        seen.append((q.stride(), k.data_ptr() - q.data_ptr(), q._base is k._base is v._base))
        return 1.0

    monkeypatch.setattr(bench_run, "providers", lambda names: {n: ((lambda *a: None), "") for n in "ab"})
    monkeypatch.setattr(bench_run, "_check", lambda fn, q, k, v, causal, grads=False: (True, 0.0))
    monkeypatch.setattr(bench_run, "_time", fake_time)
    records = run_sweep("quick", "cpu", provider_names=["a"], log=print, headdims=[64], seqlens=[16], rounds=1,
                        layout="qkvpacked")
    n, nheads, d = 16, records[0]["nheads"], 64
    size = bench_run.DTYPES[records[0]["dtype"]].itemsize
    assert seen and all(s == ((n * 3 * nheads * d, 3 * nheads * d, d, 1), nheads * d * size, True) for s in seen), seen
    assert records and all(r["layout"] == "qkvpacked" for r in records)
    assert all(report.validate(r) == [] for r in records)
    seen.clear()
    records = run_sweep("quick", "cpu", provider_names=["a"], log=print, headdims=[64], seqlens=[16], rounds=1,
                        layout="bhnd")
    assert seen and all(s[0] == (nheads * n * d, d, n * d, 1) and not s[2] for s in seen), seen
    assert all(r["layout"] == "bhnd" for r in records)
    lines = []
    assert run_sweep("quick", "cpu", log=lines.append, layout="nope") == [] and "unknown layout 'nope'" in lines[0]


def test_train_rounds_interleave_providers(monkeypatch):
    """The timed sweeps as the decode one: every provider timed once per round in every mode, round r
    starting at provider r; each record the median of its rounds; a provider that fails in a round
    is reported once and dropped from later ones."""
    calls = []

    def fake_time(fn, sets, causal, mode, stats=None, timer=None):
        name = fn()
        calls.append((name, mode, causal))
        if name == "c" and calls.count(("c", "fwd", causal)) == 2:  # round 2, its first mode
            raise RuntimeError("c broke in round 2")
        return {"a": 1.0, "b": 2.0, "c": 3.0}[name] + 0.1 * sum(c[2] == causal for c in calls)

    monkeypatch.setattr(bench_run, "providers", lambda names: {n: ((lambda n=n: n), "") for n in "abc"})
    monkeypatch.setattr(bench_run, "_check", lambda fn, q, k, v, causal, grads=False: (True, 0.0))
    monkeypatch.setattr(bench_run, "_time", fake_time)
    lines = []
    records = run_sweep("quick", "cpu", provider_names=["a"], log=lines.append, headdims=[64], seqlens=[16],
                        rounds=3)
    ours = [r for r in records if r["causal"] is False]
    # per causal value: rounds a b c | b (c fails) a | (c dropped) a b, each provider fwd then bwd
    names = [c[0] for c in calls if c[2] is False]
    assert names == ["a", "a", "b", "b", "c", "c", "b", "b", "c", "a", "a", "a", "a", "b", "b"], names
    by = {(r["provider"], r["mode"]): r for r in ours}
    assert set(by) == {("a", "fwd"), ("a", "bwd"), ("b", "fwd"), ("b", "bwd"), ("c", "fwd")}, sorted(by)
    assert not by[("c", "fwd")]["ok"] and "c broke in round 2" in by[("c", "fwd")]["error"]
    assert by[("a", "fwd")]["ms_rounds"] == pytest.approx([1.1, 2.0, 2.2])
    assert by[("a", "fwd")]["ms"] == pytest.approx(2.0)
    assert by[("b", "bwd")]["ms_rounds"] == pytest.approx([2.4, 2.8, 3.5])
    assert by[("b", "bwd")]["tflops"] > 0 and by[("b", "bwd")]["ok"]
    assert sum("c broke" in ln for ln in lines) == 2  # once per causal value


@pytest.mark.parametrize("name", ["ioattn-fp8", "ioattn-fp8-call"])
def test_fp8_providers_pass_the_check_against_their_emulation(name):
    """The FP8 providers run (the kernel under the interpreter) and pass the bench's check: within twice the
    error of their float64 FP8 emulation; a bf16-level bound would refuse them."""
    from ioattn.bench.providers import providers

    fn = providers([name])[name][0]
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 64, 2, 32, generator=g).to(DEVICE, torch.float16) for _ in range(3))
    with dispatch.forced_backend("triton"):
        verdict = bench_run._check(fn, q, k, v, True)
    assert verdict.ok and verdict.err > 1e-3, verdict  # an FP8-sized error, within its own bound


@functools.lru_cache(maxsize=None)
def _collect(*extra):
    """``pytest --collect-only`` of two small test files with ``extra`` options, in a child process:
    the completed process and the node ids it collected."""
    import subprocess
    import sys

    files = ["tests/test_layers.py", "tests/test_options.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra,
                           *files], cwd=pathlib.Path(__file__).resolve().parents[1], capture_output=True, text=True,
                          timeout=300)
    return proc, [line for line in proc.stdout.splitlines() if "::" in line]


def test_the_suite_splits_into_contiguous_shards():
    """``pytest --shard K/N`` (tests/conftest.py): the N parts are disjoint, contiguous and cover the
    collection, so a device run split over commands runs every test once."""
    from conftest import shard_mask

    for n, parts in ((10, 3), (7, 7), (5, 1), (100, 6)):
        masks = [shard_mask(f"{k}/{parts}", n) for k in range(1, parts + 1)]
        owners = [[k for k, m in enumerate(masks) if m[i]] for i in range(n)]
        assert all(len(o) == 1 for o in owners) and [o[0] for o in owners] == sorted(o[0] for o in owners)
        assert all(any(m) for m in masks)
    for bad in ("4/3", "a/3", "0/2"):
        with pytest.raises(pytest.UsageError, match="--shard"):
            shard_mask(bad, 10)
    whole = _collect()[1]
    assert _collect("--shard", "2/3")[1] == [t for t, m in zip(whole, shard_mask("2/3", len(whole))) if m]
    proc, _ = _collect("--shard", "4/3")
    assert proc.returncode == 4 and "--shard" in proc.stderr, (proc.returncode, proc.stderr[-300:])


def test_a_suite_stopped_by_a_limit_resumes_from_its_log(tmp_path):
    """``pytest --resume LOG`` (tests/conftest.py): the tests that LOG, an earlier -v run's output (with
    pytest-xdist or without), reports done are left out; the rest, in order, are run."""
    whole = _collect()[1]
    assert len(whole) > 4
    log = tmp_path / "stopped.log"
    log.write_text(f"{whole[0]} PASSED                      [  1%]\n"
                   f"[gw1] [  2%] FAILED {whole[2]} \n"
                   f"[gw0] [  3%] SKIPPED {whole[3]}\n"
                   f"{whole[4]} \n")  # started, not reported: it runs again
    assert _collect("--resume", str(log))[1] == [whole[1]] + whole[4:]



def test_timings_are_written_as_each_test_finishes(tmp_path):
    """``pytest --timings FILE`` (tests/conftest.py): one line per test phase, written as it lands, so that
    a device run stopped by a time limit still says where its time went."""
    import subprocess
    import sys

    out = tmp_path / "timings.tsv"
    test = "tests/test_layers.py"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--timings", str(out),
                           test], cwd=pathlib.Path(__file__).resolve().parents[1], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-500:]
    ran = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith(test) and " PASSED" in line]
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert ran and [r[0] for r in rows if r[1] == "call"] == ran
    assert [r[1] for r in rows] == ["setup", "call", "teardown"] * len(ran)
    assert all(float(r[2]) >= 0 and r[3] == "passed" for r in rows)


def test_package_ab_runs_each_copy_from_inside_it(tmp_path):
    """benchmarks/ab_packages.py: each copy's runs import that copy, even with the checkout first on
    ``PYTHONPATH`` (their records carry its source digest, which the script checks), each round starts
    one name later, and the table has a ratio for the second copy; a name that was not prepared is
    refused before anything runs."""
    import subprocess
    import sys
    from conftest import child_env

    root = pathlib.Path(__file__).resolve().parents[1]
    script = [sys.executable, "benchmarks/ab_packages.py"]
    # the packages folder inside a repository of its own, as the default one is in the checkout (where
    # git apply once skipped every file without an error)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    pk = tmp_path / "pk"
    subprocess.run([*script, "prepare", "--packages", str(pk), "a=HEAD", "b=."], cwd=root, check=True,
                   capture_output=True, timeout=120)
    with open(pk / "b" / "ioattn" / "api.py", "a") as f:
        f.write("\n# changed\n")
    digests = {n: bench_run.source_digest(pk / n / "ioattn") for n in "ab"}
    assert digests["a"] != digests["b"]
    # NAME=REV+PATCH: the patch's changes to the package applied to the revision's copy, or a refusal
    patch = tmp_path / "x.diff"
    lines = (root / "ioattn" / "semantics.py").read_text().splitlines()
    patch.write_text("--- a/ioattn/semantics.py\n+++ b/ioattn/semantics.py\n@@ -1,1 +1,2 @@\n"
                     f"+# patched\n {lines[0]}\n")
    subprocess.run([*script, "prepare", "--packages", str(pk), f"p=HEAD+{patch}"], cwd=root, check=True,
                   capture_output=True, timeout=120)
    assert (pk / "p" / "ioattn" / "semantics.py").read_text().splitlines()[:2] == ["# patched", lines[0]]
    other = tmp_path / "other.diff"  # a patch with no package file refused
    other.write_text("--- a/README.md\n+++ b/README.md\n@@ -1,1 +1,2 @@\n+x\n y\n")
    proc = subprocess.run([*script, "prepare", "--packages", str(pk), f"o=HEAD+{other}"], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode and "no change to the package" in proc.stderr
    patch.write_text(patch.read_text().replace(lines[0], lines[0] + " (not in the file)"))
    proc = subprocess.run([*script, "prepare", "--packages", str(pk), f"q=HEAD+{patch}"], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode and "does not apply to HEAD" in proc.stderr
    proc = subprocess.run([*script, "run", "--packages", str(pk), "--out", str(tmp_path / "ab"), "--repeat", "2",
                           "a", "b", "--", "quick", "--headdims", "64", "--seqlens", "64", "--providers", "ioattn",
                           "--rounds", "1"], cwd=root, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-800:] + proc.stderr[-800:]
    order = [line.split(" round ")[0] + line.split(" round ")[1][0] for line in proc.stdout.splitlines()
             if " round " in line]
    assert order == ["a0", "b0", "b1", "a1"], order  # each round starts one name later
    for n in "ab":
        recs = [json.loads(line) for line in (tmp_path / "ab" / f"{n}-0" / "results.jsonl").read_text().splitlines()]
        assert recs and {r["env"]["ioattn"] for r in recs} == {digests[n]}
    rows = [line for line in proc.stdout.splitlines() if line.startswith("ioattn  fwd  64")]
    assert len(rows) == 2 and all(line.endswith("x)") for line in rows), proc.stdout
    proc = subprocess.run([*script, "run", "--packages", str(pk), "--out", str(tmp_path / "ab2"), "a", "c", "--",
                           "quick"], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not prepared: c" in proc.stderr and not (tmp_path / "ab2").exists()


def test_a_step_past_its_time_is_stopped_with_what_it_started(tmp_path):
    """benchmarks/run_steps.py: a step over --timeout ends with exit code 124 and takes the processes it
    started with it (a test run's workers would otherwise hold the card through the next step); the
    next step runs, and the exit code counts the failed steps."""
    import subprocess
    import sys
    import time

    root = pathlib.Path(__file__).resolve().parents[1]
    marker = tmp_path / "child-lived"
    proc = subprocess.run([sys.executable, "benchmarks/run_steps.py", str(tmp_path), "--timeout", "2",
                           f"slow=(sleep 4; touch {marker}) & sleep 60", "next=echo ran"],
                          cwd=root, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "slow: rc=124" in proc.stdout and "next: rc=0" in proc.stdout
    assert (tmp_path / "next.log").read_text().strip() == "ran"
    time.sleep(4)
    assert not marker.exists(), "a process the stopped step started lived on"


def test_steps_from_a_file_within_a_total_time(tmp_path):
    """benchmarks/run_steps.py --file / --total: steps read from a file after those given (comments,
    blank lines, a continued line), each step's limit cut to what is left of --total, and the steps with
    too little left not started (exit code 125 each, counted as failed)."""
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    steps = tmp_path / "steps"
    steps.write_text("# a comment\n\nlong=sleep 30\njoined=echo one \\\n  two\nlate=echo late\n")
    proc = subprocess.run([sys.executable, "benchmarks/run_steps.py", str(tmp_path / "o"), "--total", "14",
                           "first=echo first", "--file", str(steps)], cwd=root, capture_output=True, text=True,
                          timeout=60)
    lines = proc.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["first", "long", "joined", "late"], proc.stdout + proc.stderr
    assert "long: rc=124" in proc.stdout and "joined: rc=125" in proc.stdout and "late: rc=125" in proc.stdout
    assert proc.returncode == 3 and (tmp_path / "o" / "first.log").read_text().strip() == "first"
    proc = subprocess.run([sys.executable, "benchmarks/run_steps.py", str(tmp_path / "p"), "--file", str(steps),
                           "--timeout", "1"], cwd=root, capture_output=True, text=True, timeout=60)
    assert (tmp_path / "p" / "joined.log").read_text().strip() == "one two", proc.stdout


_OOM_CALLS = []



def test_a_test_out_of_device_memory_runs_again_with_the_card_alone():
    """tests/conftest.py: each test's call holds the card shared (no process can hold it alone
    meanwhile); a call that runs out of device memory runs once more holding it alone (no process can
    take it shared meanwhile), so the device suite's worker count can follow the cores."""
    import fcntl

    from conftest import _CARD

    _OOM_CALLS.append(1)
    with open(_CARD, "a") as other:
        mode = fcntl.LOCK_EX if len(_OOM_CALLS) == 1 else fcntl.LOCK_SH
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, mode | fcntl.LOCK_NB)
    if len(_OOM_CALLS) == 1:
        raise torch.cuda.OutOfMemoryError("the first call runs out of device memory")
    assert len(_OOM_CALLS) == 2


def test_peer_bundle_trims_to_what_the_imports_load(tmp_path):
    """benchmarks/peer_bundle.py over wheels given (``--wheels``): the archive keeps the package's modules
    and top-level kernel sources, drops the listed subpackages' binaries, the sources' subfolders, and
    the trimmed families' modules that importing the package does not load (checked by importing the
    trimmed copy in a child process); a wheel's program lands in ``bin/``, executable."""
    import subprocess
    import sys
    import tarfile
    import zipfile

    files = {"flashinfer/__init__.py": "from flashinfer.experimental import used\nfrom flashinfer import decode\n",
             "flashinfer/decode.py": "", "flashinfer/prefill.py": "", "flashinfer/experimental/__init__.py": "",
             "flashinfer/experimental/used.py": "", "flashinfer/experimental/unused.py": "",
             "flashinfer/experimental/kernel.cubin": "x", "flashinfer/cake_a_backend/__init__.py": "",
             "flashinfer/cake_a_backend/lib.so": "x", "flashinfer/data/csrc/top.cu": "",
             "flashinfer/data/csrc/family/deep.cu": "", "ninja-0.0.data/scripts/ninja": "#!/bin/sh\n"}
    wheels = tmp_path / "w"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "flashinfer_python-0.0-py3-none-any.whl", "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    root = pathlib.Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "benchmarks/peer_bundle.py", "flashinfer", "--wheels", str(wheels),
                           "--out", str(tmp_path / "out")], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with tarfile.open(tmp_path / "out" / "flashinfer.tgz") as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
        assert tar.getmember("bin/ninja").mode & 0o111 == 0o111
    assert names == ["bin/ninja", "flashinfer/__init__.py", "flashinfer/cake_a_backend/__init__.py", "flashinfer/data/csrc/top.cu",
                     "flashinfer/decode.py", "flashinfer/experimental/__init__.py", "flashinfer/experimental/used.py",
                     "flashinfer/prefill.py"], names
