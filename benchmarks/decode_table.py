"""The decode table of an ``ioattn bench decode`` results file, with each case's cuDNN / ioattn time
ratio and both providers' timing rounds (the session scripts print it last).

    python benchmarks/decode_table.py DIR/results.jsonl
"""
import json
import sys


def main(path):
    rows = [json.loads(line) for line in open(path)]
    names = list(dict.fromkeys(r["provider"] for r in rows))
    print("batch  kvlen " + " ".join(f"{n:>13}" for n in names) + "  cudnn/ioattn  rounds (ioattn | cudnn)")
    for case in dict.fromkeys((r["batch"], r["seqlen_k"]) for r in rows):
        cell = {r["provider"]: r for r in rows if (r["batch"], r["seqlen_k"]) == case and r.get("ms")}
        us = {n: cell[n]["ms"] * 1e3 for n in cell}

        def rounds(n):
            return "/".join(f"{x * 1e3:.1f}" for x in cell[n].get("ms_rounds", [])) if n in cell else "-"
        ratio = us.get("sdpa-cudnn", float("nan")) / us.get("ioattn", float("nan"))
        print(f"{case[0]:>5} {case[1]:>6} " + " ".join(f"{us.get(n, float('nan')):>13.1f}" for n in names)
              + f"  {ratio:12.3f}  {rounds('ioattn')} | {rounds('sdpa-cudnn')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
