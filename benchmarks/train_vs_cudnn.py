"""The train sweep's ioattn figures against SDPA's cuDNN backend measured in the same run:
``python benchmarks/train_vs_cudnn.py RESULTS.jsonl [--modes fwd,bwd]`` prints mode, head dim, mask,
seqlen, both TFLOP/s and the ratio (the table the session scripts print last)."""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--modes", default="fwd,bwd,fwdbwd")
    args = ap.parse_args()
    rows = [json.loads(line) for line in open(args.results)]
    peers = {(p["mode"], p["headdim"], p["causal"], p["seqlen_q"]): p["tflops"] for p in rows
             if p["provider"] == "sdpa-cudnn" and p.get("tflops")}
    print("mode   d c      N   ioattn    cudnn  ratio")
    for r in rows:
        if r["provider"] != "ioattn" or r["mode"] not in args.modes.split(","):
            continue
        c = peers.get((r["mode"], r["headdim"], r["causal"], r["seqlen_q"]), float("nan"))
        t = r.get("tflops") or float("nan")
        print(f"{r['mode']:>6} {r['headdim']:>3} {int(r['causal'])} {r['seqlen_q']:>6} {t:8.0f} {c:8.0f} "
              f"{t / c:6.2f}{'' if r['ok'] else ' NOT OK'}")


if __name__ == "__main__":
    main()
