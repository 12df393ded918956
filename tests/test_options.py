"""The registry of switches (``ioattn.plan.options``) against what the modules define and read."""
import importlib
import pathlib
import re

import pytest

from ioattn.plan import dispatch, options

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = [p for p in (ROOT / "ioattn").rglob("*.py") if p.name != "options.py"]


def _resolve(name):
    module, _, attr = name.partition(".")
    return getattr(importlib.import_module(f"ioattn.plan.{module}"), attr)


def test_every_registered_switch_exists_and_every_preference_is_registered():
    for o in options.OPTIONS:
        if not o.name.startswith("IOATTN_"):
            obj = _resolve(o.name)
            if isinstance(obj, dispatch.Preference):
                assert obj.env in (None, o.env), o.name  # (some read their variable in their policy)
    for module in ("dispatch", "hopper", "hopper_bwd", "mods"):
        mod = importlib.import_module(f"ioattn.plan.{module}")
        for attr, value in vars(mod).items():
            if isinstance(value, dispatch.Preference):
                assert f"{module}.{attr}" in options.BY_NAME, f"{module}.{attr} is not in ioattn.plan.options.OPTIONS"


def test_environment_variables_are_the_registered_ones():
    used = set()
    for path in SOURCES:
        used |= set(re.findall(r"IOATTN_[A-Z0-9_]+", path.read_text()))
    assert used == options.ENV_VARS


def test_only_the_registry_reads_the_environment():
    for path in SOURCES:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "os.environ" in line or "getenv" in line:
                assert "TRITON_INTERPRET" in line, f"{path.relative_to(ROOT)}:{n} reads the environment: {line.strip()}"


def test_unknown_names_are_refused(monkeypatch):
    with pytest.raises(KeyError, match="not a registered option"):
        options.env("IOATTN_NO_SUCH_SWITCH")
    monkeypatch.setenv("IOATTN_HOPPER", " 1 ")
    assert options.env("IOATTN_HOPPER") == "1"


def test_records_exist_and_the_rendered_table_is_current():
    for o in options.OPTIONS:
        assert (ROOT / o.record).is_file(), o.record
    assert options.table() in (ROOT / "docs" / "options.md").read_text(), \
        "docs/options.md is stale: paste ioattn.plan.options.table()"
