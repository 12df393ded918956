"""Render the performance table of docs/performance.md from committed results files (never typed by hand).

    python benchmarks/readme_table.py RESULTS.jsonl [MORE.jsonl ...] [--write docs/performance.md]

With several files, each head dim's rows come from the last file that has that head dim, so every
row's ratios compare providers measured in one run (the caption names the file of each head dim).
``FILE:64,128`` takes only those head dims from FILE (a sweep whose other head dims ran a build that
is no longer the default). The code is ``ioattn.bench.perf_table``, where the tests reach it.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # this checkout's ioattn

from ioattn.bench.perf_table import main  # noqa: E402

if __name__ == "__main__":
    main()
