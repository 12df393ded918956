"""The latency sweep: eager calls one at a time, synchronised (``ioattn.bench.timing.latency_ms``),
with each call's host time recorded beside its latency."""
import time

import pytest
import torch

from ioattn.bench import report, run, timing


def test_latency_ms_times_each_call_alone():
    calls = []

    def sleepy(s):
        calls.append(s)
        time.sleep(0.004)

    stats = {}
    ms = timing.latency_ms(sleepy, ["a", "b"], stats=stats)
    assert 4.0 <= ms < 40 and 4.0 <= stats["host_ms"] <= ms + 1e-6
    assert len(calls) >= 1 + timing.CPU_MIN_REPS and set(calls) == {"a", "b"}  # sets rotated


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_latency_includes_the_device_time_host_does_not():
    stats = {}
    ms = timing.latency_ms(lambda s: torch.cuda._sleep(20_000_000), [None], reps=5, stats=stats)  # ~10 ms
    assert ms > 5 and stats["host_ms"] < ms / 5


def test_cpu_latency_sweep_records_latency_and_host_time(monkeypatch):
    # the CPU path a user's CPU tensors take (the interpreter would time Triton's emulation instead)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    records = run.run_sweep("latency", "cpu", seqlens=[48], headdims=[32], rounds=2, log=lambda *a: None)
    timed = [r for r in records if r.get("ms") is not None]
    assert {(r["provider"], r["mode"]) for r in timed} == {(p, m) for p in ("ioattn", "sdpa") for m in ("fwd", "bwd")
                                                            } and len(timed) == 8  # both masks
    for r in timed:
        assert r["sweep"] == "latency" and r["ok"] and len(r["ms_rounds"]) == 2
        assert 0 < r["host_ms"] <= max(r["ms_rounds"]) * 1.5  # on the CPU the host time is the latency
    text = report.table(records)
    assert "ioattn host us" in text and "sdpa host us" in text and "ioattn us" in text


def test_latency_sweep_is_listed_on_both_devices():
    assert "latency" in run.sweeps_on("cpu") and "latency" in run.sweeps_on("cuda")
    assert run.sweep_table("latency", "cuda").latency and min(run.sweep_table("latency", "cuda").seqlens) == 512
