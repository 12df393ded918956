"""A peer library packed for a GPU machine that has no package index: its wheel and its dependencies'
for that machine's Python, unpacked into one folder, trimmed to what the decode benchmark imports, as
one archive to carry.

    python benchmarks/peer_bundle.py flashinfer [--python 3.12] [--out out/peers] [--wheels DIR]

writes ``OUT/flashinfer.tgz``; there, ``tar -xzf flashinfer.tgz -C DIR`` and ``PYTHONPATH=DIR`` make
``import flashinfer`` work (its kernels compile at first use with the machine's nvcc), and
``PATH=DIR/bin:$PATH`` the programs the wheels ship (``ninja``, which that compile runs), executable. The wheel is
about 100 MB and mostly sources of kernels the benchmark never builds: the trimmed archive keeps the
Python package, the headers and the top-level kernel sources, drops the prebuilt binaries of its
other families and the Python modules of those families that ``import flashinfer`` does not load
(found by importing the trimmed copy here, with this machine's own builds of the dependencies that
have compiled parts). ``--wheels DIR``: the wheels already downloaded into DIR instead, which the
import check then uses as they are.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

PEERS = {
    "flashinfer": dict(
        wheel="flashinfer-python==0.7.4",
        deps=("apache-tvm-ffi==0.1.15.post2", "einops", "ninja", "nvidia-ml-py", "tabulate", "requests", "urllib3",
              "idna", "certifi", "charset-normalizer", "click", "tqdm", "packaging"),
        compiled=("apache-tvm-ffi==0.1.15.post2",),  # dependencies with parts built per Python version
        families=("experimental", "fused_moe", "moe_ep"),  # subpackages trimmed to the modules imported
        binaries=("cake_*_backend",),  # subpackages whose non-Python files go
        sources="data/csrc",  # kernel sources: the top level kept, subfolders dropped
        imports=("flashinfer", "flashinfer.decode", "flashinfer.prefill")),
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def download(specs, dest, python=None):
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest)]
    if python:
        cmd += ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
        cmd += [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(cmd + list(specs), check=True)


def unpack(wheels, site):
    for whl in sorted(pathlib.Path(wheels).glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)


def collect_scripts(site):
    """The wheels' programs (``NAME.data/scripts/*``, which pip would put on the PATH) moved to
    ``site/bin`` and made executable (a zip extraction keeps no modes)."""
    for script in sorted(site.glob("*.data/scripts/*")):
        dest = site / "bin" / script.name
        dest.parent.mkdir(exist_ok=True)
        shutil.move(script, dest)
        dest.chmod(0o755)


def trim(site, peer):
    pkg = site / peer["imports"][0]
    for pattern in peer["binaries"]:
        for d in pkg.glob(pattern):
            for f in d.rglob("*"):
                if f.is_file() and f.suffix != ".py":
                    f.unlink()
    for d in (pkg / peer["sources"]).iterdir():
        if d.is_dir():
            shutil.rmtree(d)
    for family in peer["families"]:
        for f in (pkg / family).rglob("*"):
            if f.is_file() and f.suffix != ".py":
                f.unlink()


def prune(site, peer, keep):
    """The trimmed families' modules that are not in ``keep`` (``imported_files``) go."""
    pkg = site / peer["imports"][0]
    for family in peer["families"]:
        for f in (pkg / family).rglob("*.py"):
            if f.resolve() not in keep:
                f.unlink()


def imported_files(site, local_deps, modules):
    """The files under ``site`` that importing ``modules`` loads (run in a child process here)."""
    code = ("import importlib, sys\n"
            f"for m in {list(modules)!r}: importlib.import_module(m)\n"
            "print('\\n'.join(getattr(m, '__file__', None) or '' for m in list(sys.modules.values())))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(local_deps), str(site)]))  # local builds first
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"the trimmed copy does not import: {proc.stderr[-2000:]}")
    return {pathlib.Path(line).resolve() for line in proc.stdout.splitlines() if line}


def bundle(name, python, out, wheels=None):
    peer = PEERS[name]
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        site, local = tmp / "site", tmp / "local"
        if wheels is None:
            download([peer["wheel"], *peer["deps"]], tmp / "w", python)
            download(peer["compiled"], tmp / "wl")  # this machine's builds, for the import below
        unpack(wheels or tmp / "w", site)
        collect_scripts(site)
        trim(site, peer)
        if wheels is None:
            unpack(tmp / "wl", local)
        prune(site, peer, imported_files(site, local, peer["imports"]))
        for cache in list(site.rglob("__pycache__")):
            shutil.rmtree(cache, ignore_errors=True)
        dest = out / f"{name}.tgz"
        with tarfile.open(dest, "w:gz") as tar:
            for child in sorted(site.iterdir()):
                tar.add(child, arcname=child.name)
    print(f"{name}: {dest} ({dest.stat().st_size / 1e6:.1f} MB)")
    return dest


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("peer", choices=sorted(PEERS))
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python version (default: 3.12)")
    ap.add_argument("--out", default="out/peers", help="folder for the archive (default: out/peers)")
    ap.add_argument("--wheels", type=pathlib.Path, default=None,
                    help="wheels already downloaded, instead of pip download (default: download them)")
    args = ap.parse_args(argv)
    bundle(args.peer, args.python, pathlib.Path(args.out), args.wheels)


if __name__ == "__main__":
    main()
