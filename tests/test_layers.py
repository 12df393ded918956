"""The layers import only downward: API (the package's top level) -> plan (``ioattn/plan/``: pure
Python decisions) -> launch (``ioattn/launch/``: buffers, descriptors, grids) -> kernels
(``ioattn/kernels/``). ``ioattn._compat`` (version checks) and ``ioattn.reference`` (the oracle
twins) and ``ioattn.layout`` (views of a tensor's storage) are shared by every layer; the kernels' constant modules (``constants``, ``hopper_flags``:
plain ints) by the plan as well. The explainer pages (``ioattn/explainers/``) sit at the API level and
read the plan (pure Python: what a call would launch) but no launch or kernel module beyond the constants."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ("ioattn._compat", "ioattn.reference", "ioattn.layout", "ioattn.semantics")
ALLOWED = {
    "kernels": SHARED + ("ioattn.kernels",),
    "plan": SHARED + ("ioattn.plan", "ioattn.kernels.constants", "ioattn.kernels.hopper_flags"),
    "launch": SHARED + ("ioattn.launch", "ioattn.kernels"),
    # the explainer pages (API level): the references, the public functions and modules above the plan
    # layer, the plan's decisions (pure Python) and the kernels' constants; never the launch layer or a kernel
    "explainers": SHARED + ("ioattn.explainers", "ioattn.kernels.constants", "ioattn.decode", "ioattn.masks",
                            "ioattn.plan", "ioattn.bench.fp8_accuracy"),
}


def _imports(path):
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ioattn"):
            package = (ROOT / node.module.replace(".", "/")).is_dir()  # ``from ioattn.plan import hopper``
            names |= {f"{node.module}.{a.name}" for a in node.names} if package else {node.module}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("ioattn")}
    return names


def test_each_layer_imports_only_the_layers_below():
    for layer, allowed in ALLOWED.items():
        for path in sorted((ROOT / "ioattn" / layer).glob("*.py")):
            key = f"{layer}/{path.name}"
            upward = {m for m in _imports(path) if not m.startswith(allowed)}
            assert not upward, f"{key} imports {sorted(upward)}"


def test_the_plan_layer_is_pure_python():
    """Nothing in ``ioattn/plan/`` imports Triton: its decisions run (and are tested) without a GPU."""
    for path in sorted((ROOT / "ioattn" / "plan").glob("*.py")):
        tree = ast.parse(path.read_text())
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
               {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {m for m in mods if m.split(".")[0] == "triton"}, f"plan/{path.name} imports Triton"
