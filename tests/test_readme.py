"""The README's code blocks run as written: every Python block in a fresh interpreter (on the GPU
when there is one, else on the CPU path, as a user would run it), every command-line block through
the installed command, and the install / test commands are the ones CI runs verbatim."""
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
from conftest import child_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, flags=re.S | re.M)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
SHELL = [line for lang, code in BLOCKS if lang == "bash" for line in code.splitlines() if line.strip()]


def _user_env():
    """The environment a user's shell has: no interpreter mode (tests/conftest.py turns it on for
    the kernel tests on machines without a GPU), this checkout importable."""
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_readme_has_the_blocks_these_tests_cover():
    assert len(PYTHON) >= 4 and SHELL, "the README's code blocks were not found"
    # "text": a diagram, nothing to run; every other block is code these tests run
    assert {lang for lang, _ in BLOCKS} <= {"python", "bash", "text"}, "a block in a language no test runs"
    assert all(not any(w in body for w in ("import ", "ioattn ", "pip ")) for lang, body in BLOCKS if lang == "text")


@pytest.mark.parametrize("index", range(len(PYTHON)))
def test_python_block_runs(index):
    proc = subprocess.run([sys.executable, "-c", PYTHON[index]], env=_user_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"README block {index} failed:\n{PYTHON[index]}\n{proc.stderr[-3000:]}"


COMMAND_LINES = [line for line in SHELL if line.startswith("ioattn ")]


@pytest.mark.parametrize("line", COMMAND_LINES)
def test_command_line_runs(line):
    """``ioattn ...`` lines run through the package's entry point (``python -m ioattn``)."""
    args = shlex.split(line)[1:]
    proc = subprocess.run([sys.executable, "-m", "ioattn", *args], env=_user_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{line!r} exited {proc.returncode}:\n{proc.stderr[-2000:]}"
    assert proc.stdout.strip(), f"{line!r} printed nothing"


def test_install_and_test_commands_are_what_ci_runs():
    """The two commands run verbatim by .ci/run (which has no other way to the test suite), so a
    README command that stops working fails CI; the CPU install names PyTorch's CPU index."""
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line for line in SHELL if line.startswith("pip install -e")]
    assert len(commands) == 2, commands
    for command in commands:
        assert any(ci_line.strip() == command for ci_line in ci.splitlines()), f".ci/run does not run {command!r}"
    cpu = [line for line in SHELL if line.startswith("pip install torch")]
    assert cpu and "--index-url https://download.pytorch.org/whl/cpu" in cpu[0]
    # the CPU build named is inside pyproject's torch range (else pip would swap it for a CUDA build)
    from ioattn import _compat
    pinned = re.search(r"torch==([\d.]+)", cpu[0]).group(1)
    assert _compat.in_range(pinned, _compat.TORCH_RANGE), (pinned, _compat.TORCH_RANGE)


def test_every_shell_line_is_covered():
    covered = set(COMMAND_LINES) | {line for line in SHELL if line.startswith("pip install")}
    assert set(SHELL) == covered, f"README commands no test runs: {sorted(set(SHELL) - covered)}"


def test_readme_is_a_front_door():
    """Under 12 KB: what and why, the commands, examples, the matrix, the layers; the rest in docs/."""
    assert len(README.encode()) < 12 * 1000, len(README.encode())
