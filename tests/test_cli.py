"""The ``ioattn`` command line: version, help at every level (checked against the parser's own
definition, so an option without help or missing from a listing fails here), errors, and a tiny
``bench quick`` and ``bench memory`` on the CPU."""
import argparse
import io
import json
import os
import subprocess
import sys

import pytest
import torch

import ioattn
from ioattn import cli
from ioattn.plan import dispatch
from ioattn.bench import memory, report
from ioattn.bench import run as bench_run
from ioattn.bench.progress import Progress, duration
from ioattn.bench.providers import providers
from ioattn.bench.timing import CPU_MIN_REPS, cpu_reps, median_ms
from conftest import child_env, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_exit = run_cli


def _subparsers(parser):
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def _levels():
    """(argv prefix, parser) for every parser of the command line: ioattn, ioattn bench, each sweep."""
    found, todo = [], [([], cli.build_parser())]
    while todo:
        prefix, parser = todo.pop(0)
        found.append((prefix, parser))
        for sub in _subparsers(parser):
            todo += [([*prefix, name], p) for name, p in sub.choices.items()]
    return found


# ---- --version ----

def test_version(capsys):
    code, out, _ = _exit(["--version"], capsys)
    first, second = out.strip().splitlines()
    assert code == 0 and first == f"ioattn {ioattn.__version__}"
    assert second.startswith("torch ") and "triton" in second


def test_version_as_module():
    env = child_env()
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-m", "ioattn", "--version"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"ioattn {ioattn.__version__}"


# ---- help, derived from the parser's definition ----

def test_every_level_has_help():
    prefixes = [prefix for prefix, _ in _levels()]
    assert [] in prefixes and ["bench"] in prefixes and ["bench", "report"] in prefixes
    assert all(["bench", s] in prefixes for s in bench_run.SWEEP_HELP)


@pytest.mark.parametrize("prefix", [prefix for prefix, _ in _levels()], ids=lambda p: " ".join(p) or "ioattn")
def test_help_lists_every_option_and_subcommand(prefix, capsys):
    parser = dict((tuple(p), x) for p, x in _levels())[tuple(prefix)]
    code, out, _ = _exit([*prefix, "--help"], capsys)
    assert code == 0
    for action in parser._actions:
        assert action.help and action.help != argparse.SUPPRESS, action
        for flag in action.option_strings:
            assert flag in out, (prefix, flag)
        if action.option_strings and action.dest not in ("help", "version"):
            assert "default" in action.help, (prefix, action.option_strings)
    for sub in _subparsers(parser):
        for choice in sub._choices_actions:
            assert choice.help and choice.dest in out, (prefix, choice.dest)


def _entry(text, name):
    """The listing entry of ``name`` in ``text`` (its first line and the deeper-indented lines after
    it), whitespace collapsed."""
    lines = text.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.split()[:1] == [name])
    indent = len(lines[i]) - len(lines[i].lstrip())
    entry = [lines[i]]
    for ln in lines[i + 1:]:
        if not ln.strip() or len(ln) - len(ln.lstrip()) <= indent:
            break
        entry.append(ln)
    return " ".join(" ".join(entry).split())


@pytest.mark.parametrize("prefix, heading", [([], "sweeps of ioattn bench"), (["bench"], "sweeps (default")],
                         ids=["ioattn", "bench"])
def test_top_levels_list_every_sweep_and_what_needs_a_gpu(prefix, heading, capsys):
    _, out, _ = _exit([*prefix, "--help"], capsys)
    listing = out.split(heading, 1)[1]
    for name in [*bench_run.SWEEP_HELP, "report"]:
        entry = _entry(listing, name)
        assert len(entry) > len(name) + 20, entry  # a description, not just the name
        assert ("[needs a GPU]" in entry) == (name != "report" and bench_run.needs_gpu(name)), entry
    assert bench_run.needs_gpu("train") and not bench_run.needs_gpu("quick")


def test_bench_help_lists_every_sweep_option_with_its_default(capsys):
    _, out, _ = _exit(["bench", "--help"], capsys)
    flags = {f for prefix, p in _levels() if prefix[:1] == ["bench"] for a in p._actions for f in a.option_strings}
    for flag in flags - {"--version"}:
        assert flag in out, flag
    for opt in cli.OPTIONS:
        assert "default" in opt.help(None), opt.flags
    assert "fp32 on the CPU" in out


# ---- errors ----

@pytest.mark.parametrize("argv, names", [
    (["nope"], ["bench"]),
    (["--nope"], ["--version", "--help"]),
    (["bench", "nope"], [*bench_run.SWEEP_HELP, "report"]),
    (["bench", "quick", "--nope"], None),  # None: the options of ioattn bench quick
    (["bench", "--nope"], None),
    (["bench", "decode", "--layout", "bhnd"], None),
    (["bench", "quick", "--dtype", "fp64"], ["fp32", "bf16", "fp16"]),
    (["bench", "quick", "--providers", "ioattn,nope"], ["ioattn", "sdpa", "sdpa-math"]),
    (["bench", "quick", "--seqlens", "64,x"], ["--seqlens", "64,x"]),
    (["bench", "quick", "--rounds", "0"], ["--rounds must be at least 1, got 0"]),
    (["bench", "mods", "--build-seqlen", "-3"], ["--build-seqlen", "expected an integer >= 0"]),
])
def test_bad_input_is_a_clear_error(argv, names, capsys):
    code, out, err = _exit(argv, capsys)
    assert code == 2 and out == ""
    if names is None:
        sweep = argv[2] if argv[2:3] and not argv[2].startswith("-") else cli.DEFAULT_SWEEP
        parser = dict((tuple(p), x) for p, x in _levels())[("bench", sweep)]
        names = cli.option_names(parser)
    for name in names:
        assert name in err, (name, err)


def test_gpu_sweep_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out, err = _exit(["bench", "train", "--out", "never-written"], capsys)
    assert code == 2 and out == "" and not os.path.exists("never-written")
    assert "needs a GPU" in err
    for name in bench_run.sweeps_on("cpu"):
        assert name in err
    lines = []
    assert bench_run.run_sweep("train", "cpu", log=lines.append) == []
    assert "needs a GPU" in lines[0] and "quick" in lines[0]


# ---- a tiny bench on the CPU ----

def _on_cpu_path(argv, capsys):
    """``ioattn ARGV`` as a user runs it on a CPU: the tiled CPU path (the tests' conftest would send
    ioattn through Triton's interpreter), one thread (tiny tensors)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with dispatch.forced_backend("reference"):
            return _exit(argv, capsys)
    finally:
        torch.set_num_threads(threads)


# on a GPU machine `bench quick` runs the GPU sweep (other providers and sizes)
CPU_SWEEP = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU sweep of bench quick")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("quick")
    capsys = _Capture()
    code, out, err = _on_cpu_path(["bench", "quick", "--seqlens", "64", "--rounds", "1", "--out", str(out_dir)],
                                  capsys)
    with open(out_dir / "results.jsonl") as f:
        records = [json.loads(line) for line in f]
    return code, out, err, records


class _Capture:
    """capsys for a module-scoped fixture: stdout and stderr swapped for the call."""

    def __init__(self):
        self.out, self.err = io.StringIO(), io.StringIO()
        self.saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self.out, self.err

    def readouterr(self):
        sys.stdout, sys.stderr = self.saved
        return argparse.Namespace(out=self.out.getvalue(), err=self.err.getvalue())


@CPU_SWEEP
def test_quick_prints_a_verdict_per_provider_and_configuration(quick_run):
    code, out, _, _ = quick_run
    assert code == 0, out
    checks = [ln.split() for ln in out.splitlines() if ln.startswith("check ")]
    expected = {(p, c) for p in bench_run.CPU_SWEEPS["quick"].providers for c in ("causal=0", "causal=1")}
    assert {(ln[1], ln[3]) for ln in checks} == expected and len(checks) == len(expected)
    for ln in checks:
        assert "max" in ln and "bound" in ln and ln[-1] == "pass", ln
    summary = [ln for ln in out.splitlines() if ln.startswith("correctness:")]
    assert summary == [summary[0]] and f"all {len(expected)} of {len(expected)} checks pass" in summary[0]


@CPU_SWEEP
def test_quick_prints_the_ratio_to_each_peer(quick_run):
    _, out, _, _ = quick_run
    header = next(ln for ln in out.splitlines() if ln.split()[:2] == ["d", "causal"])
    assert "vs sdpa" in header and "vs sdpa-math" in header
    for peer in ("sdpa", "sdpa-math"):
        assert any(ln.startswith(f"ioattn vs {peer} (quick, fp32): ioattn is as fast or faster at")
                   for ln in out.splitlines())
    assert "> 1 means ioattn is faster" in out


@CPU_SWEEP
def test_quick_records(quick_run):
    _, _, err, records = quick_run
    assert "\r" not in err  # no bar when stderr is not a terminal
    assert {r["provider"] for r in records} == {"ioattn", "sdpa", "sdpa-math"}
    for r in records:
        assert report.validate(r) == [], r
        assert r["dtype"] == "fp32" and r["ok"] and r["max_err"] <= r["err_bound"]
        assert set(r["check"]) == {"out", "dq", "dk", "dv"} and len(r["ms_rounds"]) == 1
        assert r["command"].startswith("ioattn bench quick --seqlens 64")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_dtypes_on_the_cpu(dtype):
    lines = []
    with dispatch.forced_backend("reference"):
        records = bench_run.run_sweep("quick", "cpu", dtype, ["ioattn", "sdpa"], log=lines.append, seqlens=[32],
                                      rounds=1)
    assert records and all(r["dtype"] == dtype and r["ok"] for r in records), lines
    assert bench_run.default_dtype("cpu") == "fp32" and bench_run.default_dtype("cuda") == "bf16"


def test_sdpa_provider_is_pytorch_default():
    q, k, v = (torch.randn(1, 48, 2, 16) for _ in range(3))
    sdpa, math_ = providers(["sdpa", "sdpa-math"]).values()
    assert sdpa[1] == "" and torch.allclose(sdpa[0](q, k, v, True), math_[0](q, k, v, True), atol=1e-5)


# ---- memory on the CPU ----

def test_peak_bytes_on_the_cpu():
    def step():
        a = torch.ones(5 * 2**20, dtype=torch.uint8)
        b = torch.ones(3 * 2**20, dtype=torch.uint8)
        del a, b
        return torch.ones(2**20, dtype=torch.uint8)

    assert 8 * 2**20 <= memory.peak_bytes(step, "cpu") < 8 * 2**20 + 2**16
    assert memory.running_peak([(0, 5), (1, 3), (2, -8), (3, 1)]) == 8


def test_memory_sweep_on_the_cpu():
    lines = []
    with dispatch.forced_backend("reference"):
        records = bench_run.run_sweep("memory", "cpu", log=lines.append, seqlens=[256])
    by = {r["provider"]: r for r in records}
    assert set(by) == {"ioattn", "sdpa", "sdpa-math"} and all(report.validate(r) == [] for r in records), lines
    scores_mb = 8 * 256 * 256 * 4 / 2**20  # one fp32 score matrix of 8 heads: standard attention holds it
    assert by["sdpa-math"]["peak_mem_mb"] >= scores_mb
    assert all(r["ok"] and r["peak_mem_mb"] > 0 for r in records)
    assert "peak MB" in report.table(records)


# ---- timing and progress ----

def test_cpu_reps_fill_a_bounded_time():
    assert cpu_reps(1000.0) == CPU_MIN_REPS and cpu_reps(0.001) == 20 and cpu_reps(50.0) == 6
    if not torch.cuda.is_available():
        calls = []
        median_ms(lambda s: calls.append(s), [0, 1], reps=7)
        assert len(calls) == 1 + 7 and calls[:3] == [0, 1, 0]


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_estimates_the_time_left():
    now = [0.0]
    bar = Progress(10.0, stream=_Tty(), clock=lambda: now[0])
    assert bar.left_s() is None
    now[0] = 4.0
    bar.step("a", weight=2.0)
    assert bar.left_s() == pytest.approx(16.0)
    logged = []
    bar.wrap(logged.append)("a line")
    text = bar.stream.getvalue()
    assert logged == ["a line"] and "\r[" in text and "16s left" in text
    assert duration(42) == "42s" and duration(185) == "3m05s" and duration(3720) == "1h02m"


def test_progress_off_a_terminal_is_occasional_plain_lines():
    now = [0.0]
    stream = io.StringIO()
    bar = Progress(4.0, stream=stream, clock=lambda: now[0])
    bar.step("a")
    assert stream.getvalue() == ""
    now[0] = 31.0
    bar.step("b")
    bar.close()
    assert stream.getvalue() == "progress:  50% after 31s, about 31s left\n"
