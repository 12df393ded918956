"""The tree stays legible: every kept results folder is cited by a document or record and every cited
one exists, no module of the package reaches 1,000 lines, and the code cites no lab-notebook sections."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# where a results folder may be cited: the documents, the package, the harness, the tools and the tests
CITING = [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / d for d in ("docs", "ioattn", "benchmarks", "tools",
                                                                           "tests"))]


def _citing_text():
    files = []
    for place in CITING:
        files += [place] if place.is_file() else [p for p in place.rglob("*") if p.is_file()]
    keep = [p for p in files if RESULTS not in p.parents and p.suffix in (".md", ".py", ".txt", "")]
    return "\n".join(p.read_text(errors="replace") for p in keep)


def test_every_results_folder_is_cited_and_every_cited_one_exists():
    text = _citing_text()
    kept = sorted(p.name for p in RESULTS.iterdir() if p.is_dir())
    uncited = [name for name in kept if name not in text]
    assert not uncited, f"results folders nothing cites (cite them or remove them): {uncited}"
    cited = set(re.findall(r"benchmarks/results/([A-Za-z0-9_.-]+)", text))
    missing = sorted(name for name in cited if not (RESULTS / name).is_dir())
    assert not missing, f"cited results folders that are not in the tree: {missing}"


def test_no_module_of_the_package_reaches_a_thousand_lines():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in (ROOT / "ioattn").rglob("*.py")}
    assert sizes and max(sizes.values()) < 1000, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


def test_the_code_cites_no_notebook_sections():
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "ioattn").rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"NOTES|§\s*\d", line)]
    assert not hits, hits
