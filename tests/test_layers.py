"""The layers import only downward: the kernels (``ioattn/kernels/``) import nothing from the
package's upper layers (API, plan, launch). ``ioattn._compat`` (version checks) and
``ioattn.reference`` (the oracle twins) are shared by every layer."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ("ioattn._compat", "ioattn.kernels", "ioattn.reference")
# Known exceptions, to be removed, not added to: the Gluon backward's launcher still lives in its
# kernel module and reads the host policy.
KNOWN = {"hopper_backward.py": {"ioattn.hopper", "ioattn.dispatch"}}


def _imports(path):
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ioattn"):
            names |= {node.module} if node.module != "ioattn" else {f"ioattn.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("ioattn")}
    return names


def test_kernels_import_nothing_from_the_layers_above():
    for path in sorted((ROOT / "ioattn" / "kernels").glob("*.py")):
        upward = {m for m in _imports(path) if not m.startswith(SHARED)}
        assert upward == KNOWN.get(path.name, set()), f"{path.name} imports {sorted(upward)}"
