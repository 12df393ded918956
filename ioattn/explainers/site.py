"""Builds the explainer pages: each template filled with its data, the shared stylesheet and script,
and an index, written into an empty (or new) folder. Nothing is written until every page has been
computed, and a folder that is not empty is refused: the build never overwrites or deletes."""
from __future__ import annotations

import html
import importlib
import json
import os
from importlib import resources
from pathlib import Path

from ioattn.explainers import SLOTS, Slot

INDEX = "index.html"
# the places in a template that the build fills, each exactly once
MARKS = ("<!--@style-->", "<!--@script-->", "<!--@data-->")


def _asset(name: str) -> str:
    """A file shipped with this package (a template, the stylesheet or the script)."""
    return resources.files("ioattn.explainers").joinpath(name).read_text(encoding="utf-8")


def data_json(data: dict) -> str:
    """``data`` as JSON for a ``<script type="application/json">`` element: strict JSON (a NaN or an
    infinity is an error, not a token JavaScript cannot parse), with ``<`` escaped so that no string
    can close the element."""
    return json.dumps(data, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


def fill(template: str, title: str, data: dict) -> str:
    """The template (a page's ``<main>`` and its script) inside the shared document (``shell.html``: the
    head, the stylesheet), with the shared script and the data in its marks."""
    template = _asset("shell.html").replace("<!--@page-->", template)
    parts = {
        "<!--@style-->": f"<style>\n{_asset('page.css')}</style>",
        "<!--@script-->": f"<script>\n{_asset('page.js')}</script>",
        "<!--@data-->": f'<script type="application/json" id="data">{data_json(data)}</script>',
    }
    for mark, text in parts.items():
        if template.count(mark) != 1:
            raise ValueError(f"a page template must hold {mark} exactly once, found {template.count(mark)}")
        template = template.replace(mark, text)
    return template.replace("@title@", html.escape(title))


def page_data(slot: Slot) -> dict:
    """The numbers of ``slot``'s page, computed now."""
    return importlib.import_module(f"ioattn.explainers.{slot.module}").data()


def render(slot: Slot) -> str:
    """The self-contained HTML of one page."""
    return fill(_asset(f"{slot.module}.html"), f"{slot.number}. {slot.title}", page_data(slot))


def render_index(built: tuple) -> str:
    """The index: every slot in order, a link for each page in ``built``, the others marked."""
    items = []
    for slot in SLOTS:
        if slot in built:
            head = f'<a href="{slot.filename}">{html.escape(slot.title)}</a>'
        else:
            why = f"not built here (ioattn explain --pages {slot.number})"
            head = f'{html.escape(slot.title)} <span class="later">{why}</span>'
        items.append(f'<li value="{slot.number}">{head}<br><span class="summary">{html.escape(slot.summary)}</span></li>')
    return fill(_asset("index.html"), "FlashAttention, explained on ioattn's numbers",
                {"pages": [s.number for s in built]}).replace("<!--@pages-->", "\n".join(items))


def select(numbers=None) -> tuple:
    """The slots of the page numbers asked for (None: every page), in the index's order; an unknown
    number is a ValueError naming ``--pages``."""
    if numbers is None:
        return SLOTS
    for n in numbers:
        if not 1 <= n <= len(SLOTS):
            raise ValueError(f"--pages: there is no page {n}; pages 1-{len(SLOTS)}")
    return tuple(s for s in SLOTS if s.number in set(numbers))


def out_problem(out) -> str | None:
    """Why ``out`` cannot receive the pages (it exists and is not an empty, writable folder, or it
    cannot be created), or None."""
    out = Path(out)
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            return f"--out {out} exists and is not a folder"
        entries = sorted(os.listdir(out))
        if entries:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            return (f"--out {out} is not empty ({len(entries)} entries: {shown}); the pages go into an empty "
                    "or new folder, and nothing in it is overwritten or removed")
        return None if os.access(out, os.W_OK | os.X_OK) else f"--out {out} is not writable"
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"--out {out} cannot be created: {parent} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--out {out} cannot be created: {parent} is not writable"
    return None


def _write(out: Path, files: dict) -> list:
    """Write ``files`` ({name: text}) into ``out`` (created with its missing parents); on a failure,
    remove what this call wrote and the folders it made, and raise."""
    made = [d for d in (out, *out.absolute().parents) if not d.exists()]  # deepest first
    done = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            path = out / name
            with open(path, "x", encoding="utf-8") as f:  # "x": never overwrite
                done.append(path)
                f.write(text)
    except OSError as e:
        for path in done:
            path.unlink(missing_ok=True)
        for folder in made:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise OSError(f"--out {out}: writing {len(files)} files failed ({e}); nothing was left there") from e
    return done


def build(out, numbers=None) -> list:
    """Compute the pages ``numbers`` (None: all written), then write them and ``index.html`` into
    ``out``, which must be empty or new. Returns the paths written, the index first. A bad ``out``
    or ``numbers`` is a ValueError before anything is computed or written."""
    slots = select(numbers)
    problem = out_problem(out)
    if problem:
        raise ValueError(problem)
    files = {INDEX: render_index(slots)}
    files.update({s.filename: render(s) for s in slots})
    problem = out_problem(out)  # the folder may have changed while the pages were computed
    if problem:
        raise ValueError(problem)
    return _write(Path(out), files)
