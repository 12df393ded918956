"""The explainer pages (``ioattn explain``): built in time, their embedded numbers recomputed here by
the library's functions, self-contained, the command line's refusals, and each page driven in a
headless Chromium (its controls stepped, the numbers it shows read back and compared with its data).

The browser tests need Playwright's Python package and Chromium at ``CHROMIUM`` (no browser is
downloaded); they skip with the reason where either is missing. ``--explainer-screenshots DIR``
saves each page at its final step to ``DIR/<page>.png`` (the pictures in docs/explainers/).
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

import pytest
import torch

from ioattn import merge_attention_states
from ioattn.bench.fp8_accuracy import outlier_inputs
from ioattn.explainers import (SLOTS, flash_decoding, fp8_rotation, online_softmax, pingpong, recomputation, site,
                               unified_max)
from ioattn.kernels.constants import LOG2E
from ioattn.plan.decode import PHI_RANGE
from ioattn.reference.fp8 import attention_fp8_ref, quantize_fp8_ref, random_signs, rotate
from ioattn.reference.merge import merge_states_ref
from ioattn.reference.naive import attention_ref
from ioattn.reference.tiled import flash2_forward
from conftest import run_cli

BUILD_SECONDS = 10.0
CHROMIUM = "/usr/bin/chromium"
DATA = re.compile(r'<script type="application/json" id="data">(.*?)</script>', re.S)
F64 = torch.float64


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every written page and the index, built once into a new folder: (folder, paths, seconds)."""
    out = tmp_path_factory.mktemp("explain") / "pages"
    start = time.perf_counter()
    paths = site.build(out)
    return out, paths, time.perf_counter() - start


def embedded(path: Path) -> dict:
    """The JSON a page embeds (the element its script reads)."""
    found = DATA.findall(path.read_text(encoding="utf-8"))
    assert len(found) == 1, path
    return json.loads(found[0])


def page(built, module) -> dict:
    slot = next(s for s in SLOTS if s.module == module.__name__.rsplit(".", 1)[1])
    return embedded(built[0] / slot.filename)


def t(x):
    return torch.tensor(x, dtype=F64)


# ---------------------------------------------------------------- (a) the build and its numbers

def test_the_build_writes_every_page_and_the_index_in_time(built):
    out, paths, seconds = built
    assert seconds < BUILD_SECONDS, f"building the pages took {seconds:.1f} s"
    assert [p.name for p in paths] == [site.INDEX] + [s.filename for s in SLOTS]
    assert sorted(os.listdir(out)) == sorted(p.name for p in paths)
    assert [s.number for s in SLOTS] == list(range(1, 9))


def test_each_page_embeds_a_fresh_computation_of_its_numbers(built):
    for slot in SLOTS:
        again = json.loads(site.data_json(site.page_data(slot)))
        assert embedded(built[0] / slot.filename) == again, slot.filename
        source = again["source"]
        computed = "computed" in source and "ioattn." in source
        measured = source.startswith("Measured on ") and "ioattn bench" in source  # page 5's trace
        assert computed or measured, slot.filename


def test_the_pingpong_page_is_the_committed_trace_of_the_untraced_kernels_result():
    """Page 5's record: a Gluon ping-pong run whose traced output equals the untraced kernel's, one lane
    per consumer warpgroup, every section's stamps in time order."""
    rec = pingpong.load()
    assert rec["variant"] == "pingpong" and rec["max_diff_untraced"] == 0.0 and rec["num_wg"] == 2
    for cta in rec["ctas"]:
        assert len(cta) == rec["num_wg"]
        for wg in cta:
            for stamps in wg:
                known = [t for t in stamps if t is not None]
                assert known == sorted(known), stamps


def test_memory_wall_shows_the_committed_measurements_of_one_head():
    """Page 1's measured points: the one-head bf16 records of the committed ``ioattn io --measure`` run,
    each a point of the sliders; a call with more heads is left out."""
    from ioattn.explainers import memory_wall

    got = memory_wall.measured()
    assert got and all((m["n"], m["d"]) in {(n, d) for n in memory_wall.SEQLENS for d in memory_wall.HEAD_DIMS}
                       for m in got)
    assert all(0 < m["fa2"] < m["standard"] and "--measure" in m["command"] for m in got)
    rec = dict(problem=dict(batch=4, nheads=16, seqlen_q=4096, headdim=128, dtype="bf16", causal=False),
               rows=[], command="x")
    assert memory_wall.measured(json.dumps(rec)) == []


def test_memory_wall_is_the_io_models_forward(built):
    """Page 1's points are ``io_model.predict``'s forward rows: S and P standard attention's whole
    quadratic part (4 N² values a head), and the minimum below both."""
    from ioattn.reference import io_model

    d = embedded(built[0] / "1-memory-wall.html")
    assert len(d["points"]) == len(d["seqlens"]) * len(d["head_dims"])
    for p in d["points"]:
        pred = io_model.predict(io_model.Problem(p["n"], p["d"], dtype="bf16"), "h100")
        for a in d["algorithms"]:
            assert p[a]["bytes"] == pred.find(a, "forward").bytes
        assert p["sp_bytes"] == 4 * p["n"] ** 2 * 2
        assert p["minimum"]["bytes"] < min(p["fa2"]["bytes"], p["standard"]["bytes"])
    assert d["device"]["balance"] == pytest.approx(d["device"]["peak"] / d["device"]["bandwidth"])


def test_work_partitioning_is_the_plans_and_the_masks(built):
    """Page 4's points are the forward plan's tiles and programs; each query block's visited key blocks
    are ``key_block_range``'s, and whole / masked / skipped agree with a brute-force look at every
    (row, key) of the tile under the mask."""
    from ioattn.masks import keep_mask
    from ioattn.plan import forward as forward_plan

    d = embedded(built[0] / "4-work-partitioning.html")
    assert len(d["points"]) == 2 * len(d["seqlens"]) * len(d["head_dims"])
    for p in d["points"]:
        sig = forward_plan.Signature(batch=1, seqlen_q=p["n"], seqlen_k=p["n"], nheads=d["nheads"],
                                     nheads_kv=d["nheads"], head_dim=p["d"], element_size=2, varlen=False,
                                     causal=p["causal"], window=(-1, -1), softcap=0.0, softmax_scale=p["d"] ** -0.5,
                                     alibi=False, device_sms=d["sms"])
        plan = forward_plan.plan_forward(sig)
        assert (p["block_m"], p["block_n"], p["tiles"], p["programs"]) == (plan.block_m, plan.block_n,
                                                                            plan.num_tiles, plan.programs)
        if p["n"] > 1024:
            continue  # the brute force below at the small lengths
        keep = keep_mask(p["n"], p["n"], (-1, 0) if p["causal"] else (-1, -1))
        bm, bn = p["block_m"], p["block_n"]
        for m, (lo, whole, hi) in enumerate(p["spans"]):
            for n in range(p["num_n"]):
                tile = keep[m * bm:(m + 1) * bm, n * bn:(n + 1) * bn]
                kind = "skipped" if not tile.any() else "whole" if tile.all() else "masked"
                want = "skipped" if not lo <= n < hi else "whole" if n < whole else "masked"
                assert kind == want, (p["n"], p["d"], p["causal"], m, n, kind, want)


def test_online_softmax_ends_at_flash2_forward_and_attention_ref(built):
    d = page(built, online_softmax)
    q, k, v = (x[None, :, None, :] for x in online_softmax.inputs())
    ref, ref_lse = attention_ref(q, k, v)
    assert torch.allclose(t(d["scores"]), online_softmax.inputs()[0] @ online_softmax.inputs()[1].T / 2, atol=1e-15)
    for b, run in d["runs"].items():
        out, lse = flash2_forward(q, k, v, block_m=4, block_n=int(b))
        last = run["steps"][-1]
        o = t(last["acc"]) / t(last["l"])[:, None]
        assert torch.allclose(o, t(run["out"]), atol=1e-15, rtol=0)
        assert torch.allclose(o, out[0, :, 0], atol=1e-15, rtol=0), b
        assert torch.allclose(o, ref[0, :, 0], atol=1e-14, rtol=0), b
        assert torch.allclose(t(run["lse"]), lse[0, 0], atol=1e-14, rtol=0), b
        assert torch.allclose(t(run["lse"]), ref_lse[0, 0], atol=1e-14, rtol=0), b
        # the final state is softmax's own max and sum over all keys
        s = t(d["scores"])
        assert torch.allclose(t(last["m"]), s.amax(-1), atol=1e-15, rtol=0)
        assert torch.allclose(t(last["l"]), torch.exp(s - s.amax(-1, keepdim=True)).sum(-1), atol=1e-14)
        assert len(run["steps"]) == math.ceil(6 / int(b)) and run["diff_ref"] < 1e-14


def test_recomputation_rebuilds_p_and_matches_autograd(built):
    d = page(built, recomputation)
    q, k, v, dout = recomputation.inputs()
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out, lse = attention_ref(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert torch.allclose(t(d["grads"][name]), g[0, :, 0], atol=1e-14, rtol=0), name
    p = torch.softmax(q[0, :, 0] @ k[0, :, 0].T / 2, dim=-1)
    assert torch.allclose(t(d["p_std"]), p, atol=1e-15)
    rebuilt = torch.cat([t(st["p"]) for st in d["steps"]], dim=1)
    assert torch.allclose(rebuilt, p, atol=1e-15, rtol=0)
    assert torch.allclose(t(d["lse"]), lse[0, 0].detach(), atol=1e-14)
    assert torch.allclose(t(d["steps"][-1]["dq"]), grads[0][0, :, 0], atol=1e-14)
    assert torch.allclose(torch.cat([t(st["dk"]) for st in d["steps"]]), grads[1][0, :, 0], atol=1e-14)
    for row in d["memory"]["rows"]:
        n = row["n"]
        assert row["p_bytes"] == 2 * n * n and row["lse_bytes"] == 4 * n and row["o_bytes"] == 2 * n * 128


def test_flash_decoding_merge_equals_unsplit_attention(built):
    d = page(built, flash_decoding)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, dtype=F64, generator=g) for s in ((1, 1, 1, 16), (1, 64, 1, 16), (1, 64, 1, 16)))
    ref, ref_lse = attention_ref(q, k, v)
    assert torch.allclose(t(d["ref_out"]), ref.flatten(), atol=0, rtol=0)
    for k_splits, run in d["runs"].items():
        assert len(run["bounds"]) == int(k_splits) and run["bounds"][-1][1] == 64
        assert torch.allclose(t(run["out"]), ref.flatten(), atol=1e-14, rtol=0), k_splits
        assert abs(run["lse"] - ref_lse.item()) < 1e-13
        # the merge again from the embedded partial results, by the reference merge
        out, lse = merge_states_ref(t(run["outs"]), t(run["lses"]))
        assert torch.allclose(out, t(run["out"]), atol=1e-15) and abs(lse.item() - run["lse"]) < 1e-14
        assert abs(sum(run["weights"]) - 1) < 1e-14
        # the public merge (a float32 Triton kernel under the interpreter, the reference on the CPU)
        public, _ = merge_attention_states(t(run["outs"])[:, None], t(run["lses"])[:, None])
        assert torch.allclose(public[0], t(run["out"]), atol=1e-6, rtol=0)
    for row in d["occupancy"]:
        assert row["programs"] == row["batch"] * 8 * row["splits"]
        assert row["busy"] == min(row["programs"], 132) / 132


def test_unified_max_follows_the_decode_kernels_rule(built):
    d = page(built, unified_max)
    below, above = PHI_RANGE[torch.float32]
    q, k, v = unified_max.inputs()
    s = (q[0, 0, 0] @ k[0, :, 0].T) / 8
    assert abs(s[unified_max.SINK].item() - unified_max.SINK_SCORE) < 1e-12
    kinds = set()
    for at in d["phis"]:
        assert at["diff_f64"] < 1e-14 and at["diff_f32"] < 1e-6, at["phi"]
        for j, sp in enumerate(at["splits"]):
            m = s[16 * j:16 * (j + 1)].max().item()
            assert abs(sp["m"] - m) < 1e-5
            assert sp["kept"] == (-below <= (sp["m"] - at["phi"]) * LOG2E <= above)
            # where exp(m - phi) lands in float32, away from the edges of its range (log2 units)
            gap = sp["gap2"]
            if gap > 128.5 or gap < -150.5:
                assert sp["top_state"] == ("inf" if gap > 0 else "0") == sp["l_state"], (at["phi"], j)
            elif -125.5 < gap < 123.5:  # and the sum of 16 such terms stays finite
                assert sp["top_state"] == "normal" and sp["l_state"] == "normal", (at["phi"], j)
            kinds.add((sp["kept"], sp["l_state"]))
    assert {(True, "normal"), (False, "normal"), (False, "inf"), (False, "0")} <= kinds  # every case shown
    bounds = d["fp32"]
    assert torch.isinf(torch.exp(torch.tensor(bounds["overflow"] + 1e-3)))
    assert torch.isfinite(torch.exp(torch.tensor(bounds["overflow"] - 1e-3)))
    assert torch.exp(torch.tensor(bounds["zero"] - 0.05)) == 0 and torch.exp(torch.tensor(bounds["zero"] + 0.05)) > 0
    tiny = torch.finfo(torch.float32).tiny
    assert torch.exp(torch.tensor(bounds["normal"] - 1e-3)) < tiny <= torch.exp(torch.tensor(bounds["normal"] + 1e-3))
    assert d["below"] * LOG2E == pytest.approx(below) and d["above"] * LOG2E == pytest.approx(above)
    weights = torch.exp(t([attention_ref(q, k[:, a:a + 16], v[:, a:a + 16])[1].item() for a in range(0, 64, 16)])
                        - attention_ref(q, k, v)[1].item())
    assert torch.allclose(t(d["weights"]), weights, atol=1e-15)


def test_fp8_rotation_rmse_is_attention_fp8_refs(built):
    d = page(built, fp8_rotation)
    q, k, v = outlier_inputs(1, 1, 512, 64, 0)
    signs = random_signs(64, 1)
    ref, _ = attention_ref(q, k, v)
    for shown, rotated in zip(d["recipes"], (False, True)):
        qq, kk = (rotate(q, signs), rotate(k, signs)) if rotated else (q, k)
        (q8, qs), (k8, ks), (v8, vs) = (quantize_fp8_ref(x, "tensor") for x in (qq, kk, v))
        rmse = (attention_fp8_ref(q8, k8, v8, qs, ks, vs) - ref).pow(2).mean().sqrt().item()
        assert shown["rmse"] == pytest.approx(rmse, rel=1e-12)
        assert shown["q_channels"] == pytest.approx(qq.abs().amax(dim=(0, 1, 2)).tolist(), rel=1e-15)
        assert shown["q_descale"] == qs.item() and shown["k_descale"] == ks.item()
    assert d["recipes"][1]["rmse"] < d["recipes"][0]["rmse"]  # the rotation helps on these inputs
    assert max(d["recipes"][1]["q_channels"]) < max(d["recipes"][0]["q_channels"])


# ---------------------------------------------------------------- (b) self-contained

EXTERNAL = [re.compile(p, re.I) for p in (
    r"""(?:src|href|action|srcset|poster|data)\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:|//)""",  # any scheme or //
    r"url\(", r"@import", r"<link\b", r"<iframe\b", r"<img\b", r"<object\b", r"<embed\b",
    r"\bfetch\(", r"XMLHttpRequest", r"\bimport\(", r"WebSocket", r"EventSource", r"sendBeacon", r"\.src\s*=",
)]
SVG_NS = "http://www.w3.org/2000/svg"


def test_pages_reference_nothing_outside_themselves(built):
    out, paths, _ = built
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for pattern in EXTERNAL:
            assert not pattern.search(text), (path.name, pattern.pattern, pattern.search(text))
        # the only URL-like text: the SVG namespace's name, which is never fetched
        assert re.findall(r"(?:https?:)?//[\w.-]+\.\w", text.replace(SVG_NS, "")) == [], path.name
        for href in re.findall(r'href="([^"]*)"', text):
            assert (out / href).is_file(), (path.name, href)


# ---------------------------------------------------------------- (c) the command line

def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


_run = run_cli


def test_the_cli_refuses_a_folder_that_is_not_empty_and_leaves_it_alone(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("keep me")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "index.html").write_text("mine")
    before = _snapshot(tmp_path)
    code, out, err = _run(["explain", "--out", str(tmp_path)], capsys)
    assert code == 2 and out == ""
    assert "--out" in err and "not empty" in err and "notes.txt" in err
    assert _snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["notes.txt", "sub"]


@pytest.mark.parametrize("target, words", [("a-file", "is not a folder"), ("a-file/pages", "cannot be created")])
def test_the_cli_refuses_a_path_it_cannot_write(tmp_path, capsys, target, words):
    (tmp_path / "a-file").write_text("keep me")
    before = _snapshot(tmp_path)
    code, _, err = _run(["explain", "--out", str(tmp_path / target)], capsys)
    assert code == 2 and "--out" in err and words in err
    assert _snapshot(tmp_path) == before


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write into any folder")
def test_the_cli_refuses_a_read_only_folder(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        code, _, err = _run(["explain", "--out", str(locked / "pages")], capsys)
        assert code == 2 and "not writable" in err and not (locked / "pages").exists()
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("pages, words", [("9", "no page 9"), ("0", ">= 1"), ("2,x", "integers")])
def test_the_cli_refuses_unknown_pages_before_writing(tmp_path, capsys, pages, words):
    code, _, err = _run(["explain", "--out", str(tmp_path / "pages"), "--pages", pages], capsys)
    assert code == 2 and "--pages" in err and words in err
    assert not (tmp_path / "pages").exists()


def test_a_failed_write_leaves_nothing(tmp_path, capsys, monkeypatch):
    real_open, calls = open, []

    def open_twice(path, *args, **kwargs):  # the second file cannot be written
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(site, "open", open_twice, raising=False)
    code, _, err = _run(["explain", "--out", str(tmp_path / "new" / "pages"), "--pages", "2"], capsys)
    assert code == 1 and "No space left" in err and len(calls) == 2
    assert os.listdir(tmp_path) == []  # the file written first and both folders made are gone


def test_the_cli_writes_the_pages_asked_for_and_opens_the_index(tmp_path, capsys, monkeypatch):
    opened = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    code, out, _ = _run(["explain", "--out", str(tmp_path / "pages"), "--pages", "6,2", "--open"], capsys)
    assert code == 0 and "wrote 3 files" in out
    assert sorted(os.listdir(tmp_path / "pages")) == ["2-online-softmax.html", "6-flash-decoding.html", "index.html"]
    assert opened == [(tmp_path / "pages" / "index.html").resolve().as_uri()]
    index = (tmp_path / "pages" / "index.html").read_text()
    assert 'href="2-online-softmax.html"' in index and 'href="3-recomputation.html"' not in index
    assert "ioattn explain --pages 3" in index


# ---------------------------------------------------------------- (d) in a headless browser

def shown(text: str):
    """A number as a page shows it (fmt in page.js): "-∞" is None, a unit or note after it is dropped."""
    text = text.strip().replace("−", "-")
    if text == "-∞":
        return None
    return float(text.split()[0].rstrip("%×"))


def assert_shows(text: str, value, digits: int):
    """``text`` is ``value`` rounded to ``digits`` significant digits (or -inf as None)."""
    got = shown(text)
    if value is None:
        assert got is None, text
    else:
        assert got == pytest.approx(value, rel=0.501 * 10 ** (1 - digits), abs=1e-300), (text, value)


@pytest.fixture(scope="module")
def browser():
    sync = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is not installed "
                               "(pip install playwright; no browser download needed)")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    with sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


class Visit:
    """One page open in the browser, its console errors, page errors and network requests recorded."""

    def __init__(self, browser, path: Path):
        self.url = path.as_uri()
        self.page = browser.new_page(viewport={"width": 1000, "height": 900})
        self.problems, self.requests = [], []
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(m.text))
        self.page.on("pageerror", lambda e: self.problems.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(self.url)

    def text(self, selector: str) -> str:
        return self.page.text_content(selector)

    def slide(self, selector: str, index: int):
        self.page.fill(selector, str(index))

    def drag_to_end(self, selector: str):
        """Drag a range input's thumb to its right end with the mouse."""
        slider = self.page.locator(selector)
        slider.scroll_into_view_if_needed()
        box = slider.bounding_box()
        self.page.mouse.move(box["x"] + 4, box["y"] + box["height"] / 2)
        self.page.mouse.down()
        self.page.mouse.move(box["x"] + box["width"] + 40, box["y"] + box["height"] / 2, steps=8)
        self.page.mouse.up()

    def finish(self, shots, name: str, loads=()):
        """Save the page as it is now (with --explainer-screenshots), then check that nothing failed and
        that the only requests were the page itself and ``loads`` (pages it was sent to)."""
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            self.page.evaluate("document.activeElement && document.activeElement.blur()")  # no focus ring
            self.page.screenshot(path=str(Path(shots) / f"{name}.png"), full_page=True)
        self.page.close()
        assert self.problems == [], self.problems
        assert self.requests == [self.url, *loads], self.requests


@pytest.fixture
def shots(request):
    return request.config.getoption("--explainer-screenshots")


def visit(browser, built, module):
    slot = next(s for s in SLOTS if s.module == module)
    return Visit(browser, built[0] / slot.filename), embedded(built[0] / slot.filename), slot


def test_browser_index(browser, built, shots):
    v = Visit(browser, built[0] / site.INDEX)
    items = v.page.locator("ol.pages li")
    assert items.count() == len(SLOTS)
    for slot in SLOTS:
        link = v.page.locator(f'a[href="{slot.filename}"]')
        assert link.count() == 1, slot
    if shots:  # the index itself, before the link below is followed
        Path(shots).mkdir(parents=True, exist_ok=True)
        v.page.screenshot(path=str(Path(shots) / "index.png"), full_page=True)
    v.page.click('a[href="2-online-softmax.html"]')
    assert v.page.title().startswith("2. Online softmax")
    v.finish(None, "index", loads=[(built[0] / "2-online-softmax.html").as_uri()])


def test_browser_memory_wall(browser, built, shots):
    v, d, slot = visit(browser, built, "memory_wall")
    for di, hd in enumerate(d["head_dims"]):
        v.slide("#d", di)
        for ni, n in enumerate(d["seqlens"]):
            v.slide("#n", ni)
            p = next(x for x in d["points"] if x["n"] == n and x["d"] == hd)
            assert v.text("#n-text") == str(n) and v.text("#d-text") == str(hd)
            assert_shows(v.text("#fa2-ratio"), p["fa2"]["vs_standard"], 3)
            assert_shows(v.text("#min-ratio"), p["minimum"]["vs_standard"], 3)
            assert v.text("#fa2-bound") == p["fa2"]["bound"]
            for a in d["algorithms"]:
                assert_shows(v.text(f"#int-{a}"), p[a]["intensity"], 3)
                assert v.text(f"#bound-{a}") == p[a]["bound"]
            m = next((x for x in d["measured"] if x["n"] == n and x["d"] == hd), None)
            if m is None:
                assert v.text("#measured").startswith("Not measured at this point")
            else:  # the measured bytes beside the model's rows
                assert_shows(v.text("#m-fa2-ratio"), m["fa2"] / p["fa2"]["bytes"], 3)
                assert_shows(v.text("#m-min-ratio"), m["fa2"] / p["minimum"]["bytes"], 3)
                assert_shows(v.text("#m-std-ratio"), m["standard"] / p["standard"]["bytes"], 3)
                assert m["command"] in v.text("#measured")
    v.slide("#d", d["head_dims"].index(d["default"]["d"]))
    v.slide("#n", d["seqlens"].index(d["default"]["n"]))
    v.finish(shots, slot.filename[:-5])


def test_browser_work_partitioning(browser, built, shots):
    v, d, slot = visit(browser, built, "work_partitioning")
    for causal in (False, True):
        if v.page.is_checked("#causal") != causal:
            v.page.click("#causal")
        for di, hd in enumerate(d["head_dims"]):
            v.slide("#d", di)
            for ni, n in enumerate(d["seqlens"]):
                v.slide("#n", ni)
                p = next(x for x in d["points"] if x["n"] == n and x["d"] == hd and x["causal"] == causal)
                assert v.text("#visited") == str(p["visited"]) and v.text("#skipped") == str(p["skipped"])
                assert v.text("#programs") == str(p["programs"]) and v.text("#variant") == p["variant"]
                assert v.page.locator("#grid rect").count() == p["num_m"] * p["num_n"]
    v.slide("#d", d["head_dims"].index(d["default"]["d"]))
    v.slide("#n", d["seqlens"].index(d["default"]["n"]))
    v.finish(shots, slot.filename[:-5])


def test_browser_online_softmax(browser, built, shots):
    v, d, slot = visit(browser, built, "online_softmax")
    for b in range(1, 7):
        v.slide("#block", b)
        run = d["runs"][str(b)]
        assert v.text("#block-text").startswith(str(b))
        assert_shows(v.text("#diff-ref"), run["diff_ref"], 2)
        for i in range(4):
            assert_shows(v.text(f"#final-{i}-0"), run["out"][i][0], 6)
        for j, st in enumerate(run["steps"]):
            if j:
                v.page.click("#next")
            assert v.text("#step-text").startswith(f"block {j + 1} of {len(run['steps'])}")
            for i in range(4):
                assert_shows(v.text(f"#m-old-{i}"), st["m_old"][i], 5)
                assert_shows(v.text(f"#m-{i}"), st["m"][i], 5)
                assert_shows(v.text(f"#alpha-{i}"), st["alpha"][i], 5)
                assert_shows(v.text(f"#l-{i}"), st["l"][i], 5)
                assert_shows(v.text(f"#acc1-{i}"), st["acc"][i][1], 5)
        assert v.page.is_disabled("#next")
    v.slide("#block", d["default_block"])
    v.drag_to_end("#step")
    assert v.text("#step-text").startswith("block 3 of 3")
    v.page.click("#prev")
    assert v.text("#step-text").startswith("block 2 of 3")
    v.page.click("#next")
    v.finish(shots, slot.filename[:-5])


def test_browser_recomputation(browser, built, shots):
    v, d, slot = visit(browser, built, "recomputation")
    for j, st in enumerate(d["steps"]):
        if j:
            v.page.click("#next")
        c0 = st["cols"][0]
        for i in range(d["seqlen"]):
            assert_shows(v.text(f"#P-{i}-{c0}"), st["p"][i][0], 2)
            assert_shows(v.text(f"#dq-{i}-3"), st["dq"][i][3], 2)
        assert_shows(v.text("#p-diff"), d["p_diff"][j], 2)
        assert_shows(v.text("#dv-1-2"), st["dv"][1][2], 2)
    assert v.page.is_disabled("#next")
    for g in ("dq", "dk", "dv"):
        assert_shows(v.text(f"#ag-{g}"), d["diff_autograd"][g], 2)
    rows = d["memory"]["rows"]
    v.drag_to_end("#mem")
    assert v.text("#mem-n") == str(rows[-1]["n"])
    for i, row in enumerate(rows):
        v.slide("#mem", i)
        std, flash = row["o_bytes"] + row["p_bytes"], row["o_bytes"] + row["lse_bytes"]
        assert v.text("#mem-n") == str(row["n"])
        assert_shows(v.text("#mem-ratio"), std / flash, 3)
        number, unit = v.text("#mem-std").split()
        assert float(number) * 1024 ** ["B", "KiB", "MiB", "GiB", "TiB"].index(unit) == pytest.approx(std, rel=5e-3)
    v.slide("#mem", [r["n"] for r in rows].index(4096))
    v.finish(shots, slot.filename[:-5])


def test_browser_flash_decoding(browser, built, shots):
    v, d, slot = visit(browser, built, "flash_decoding")
    for i, k in enumerate(d["split_counts"]):
        v.slide("#splits", i)
        run = d["runs"][str(k)]
        assert v.text("#splits-text") == str(k)
        for j in range(k):
            assert_shows(v.text(f"#lse-{j}"), run["lses"][j], 6)
            assert_shows(v.text(f"#weight-{j}"), run["weights"][j], 4)
        for c in range(d["head_dim"]):
            assert_shows(v.text(f"#merged-0-{c}"), run["out"][c], 3)
        assert_shows(v.text("#diff-out"), run["diff_out"], 2)
        for bi, batch in enumerate(d["batches"]):
            v.slide("#batch", bi)
            row = next(r for r in d["occupancy"] if r["batch"] == batch and r["splits"] == k)
            assert v.text("#programs") == str(row["programs"]) and v.text("#waves") == str(row["waves"])
            assert_shows(v.text("#busy"), 100 * row["busy"], 3)
    v.slide("#batch", 0)
    v.slide("#splits", d["split_counts"].index(d["default_splits"]))
    v.finish(shots, slot.filename[:-5])


def test_browser_unified_max(browser, built, shots):
    v, d, slot = visit(browser, built, "unified_max")
    for i, at in enumerate(d["phis"]):
        v.slide("#phi", i)
        assert v.text("#phi-text") == str(at["phi"])
        assert_shows(v.text("#diff-f32"), at["diff_f32"], 2)
        for j, sp in enumerate(at["splits"]):
            assert_shows(v.text(f"#m-{j}"), sp["m"], 4)
            assert_shows(v.text(f"#gap-{j}"), sp["gap2"], 4)
            assert v.text(f"#kept-{j}") == ("keeps φ" if sp["kept"] else "recomputes exactly")
            if sp["l_state"] in ("inf", "0"):
                assert v.text(f"#l-{j}").startswith(sp["l_state"])
            else:
                assert_shows(v.text(f"#l-{j}"), sp["l"], 4)
    v.drag_to_end("#phi")
    assert v.text("#phi-text") == str(d["phis"][-1]["phi"])
    v.slide("#phi", [at["phi"] for at in d["phis"]].index(d["default_phi"]))
    v.finish(shots, slot.filename[:-5])


def test_browser_fp8_rotation(browser, built, shots):
    v, d, slot = visit(browser, built, "fp8_rotation")
    for button, r in zip(("#plain", "#rotated"), d["recipes"]):
        v.page.click(button)
        assert "on" in v.page.get_attribute(button, "class")
        assert_shows(v.text("#rmse"), r["rmse"], 3)
        assert_shows(v.text("#q-scale"), r["q_descale"], 3)
        assert_shows(v.text("#rmse-pct"), 100 * r["rmse"] / r["ref_rms"], 3)
    for i, r in enumerate(d["recipes"]):
        assert_shows(v.text(f"#rmse-{i}"), r["rmse"], 3)
        assert_shows(v.text(f"#s-max-{i}"), r["score_error_max"], 3)
    assert_shows(v.text("#ratio"), d["recipes"][0]["rmse"] / d["recipes"][1]["rmse"], 3)
    assert_shows(v.text("#no-1"), d["no_outliers"][1], 3)
    v.finish(shots, slot.filename[:-5])


def test_browser_pingpong(browser, built, shots):
    """The measured record's CTAs on the slider: each one's overlap table and its lanes' bars (every
    interval drawn once all sections are shown)."""
    v, d, slot = visit(browser, built, "pingpong")
    for i, cta in enumerate(d["ctas"]):
        v.slide("#cta", i)
        v.slide("#zoom", cta["sections"])
        assert v.text("#cta-text") == str(i) and v.text("#end") == str(cta["end"])
        for w, share in enumerate(cta["overlap"]):
            row = v.page.locator("#overlap tr").nth(w)
            assert row.locator("td").nth(1).text_content() == str(cta["softmax_cycles"][w])
            assert_shows(row.locator("td").nth(2).text_content(), 100 * share, 3)
        for kind in ("s", "pv", "softmax"):
            drawn = v.page.locator(f'#chart rect[data-kind="{kind}"]').count()
            assert drawn == sum(len(lane[kind]) for lane in cta["lanes"]), kind
    v.slide("#cta", 0)
    v.slide("#zoom", min(8, d["ctas"][0]["sections"]))
    assert v.page.locator('#chart rect[data-kind="softmax"]').count() < sum(
        len(lane["softmax"]) for lane in d["ctas"][0]["lanes"])
    v.finish(shots, slot.filename[:-5])


def _pingpong_record():
    """A schedule record shaped as ``ioattn bench pingpong-trace`` writes one, its numbers made up for
    this test (page 5 is built from a measured one): warpgroup 1 a half section behind warpgroup 0."""
    def wg(shift):
        secs = []
        for j in range(5):
            t = 100 * j + shift
            secs.append([t, t + 40, t + 90, t + 70 if j else None])
        secs.append([500 + shift, None, None, 560 + shift])
        return secs
    return dict(device="test", sm_count=132, seqlen=512, headdim=128, nheads=1, causal=False, variant="pingpong",
                block_m=128, block_n=128, num_wg=2, events=["turn", "s_ready", "softmax_done", "pv_done"],
                unit="cycles", max_diff_untraced=0.0, ctas=[[wg(0), wg(50)]])


def test_pingpong_page_measures_the_overlap_of_softmax_and_the_other_warpgroups_products():
    from ioattn.explainers import pingpong, site

    data = pingpong.data(_pingpong_record())
    lanes = data["ctas"][0]["lanes"]
    assert lanes[0]["s"][0] == [0, 40] and lanes[0]["softmax"][0] == [40, 90] and lanes[0]["pv"][0] == [100, 170]
    # warpgroup 0's softmax [100j + 40, 100j + 90] against warpgroup 1's S [100j + 50, 100j + 90] and its
    # P V [100j + 50, 100j + 120] (j >= 1): covered from 100j + 50, 40 of 50 cycles, every section
    assert data["ctas"][0]["overlap"][0] == pytest.approx(0.8)
    assert data["ctas"][0]["end"] == 610
    page = site.fill(site._asset("pingpong.html"), "5. test", data)
    assert "<!--@" not in page and '"variant":"pingpong"' in page
