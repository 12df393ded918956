"""The ``ioattn`` command: ``ioattn bench [sweep] [--out DIR]``."""
from __future__ import annotations

import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: ioattn bench [quick|train|memory|decode] [--dtype bf16|fp16] [--providers a,b] "
              "[--out DIR]")
        return 0
    if argv[0] == "bench":
        from ioattn.bench.run import main as bench_main
        return bench_main(argv[1:])
    print(f"unknown command {argv[0]!r}; try: ioattn bench", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
