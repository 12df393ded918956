"""Pick the forward tiles with the best geometric-mean ratio to SDPA flash over the points of an
``ab_fwd.py`` results file, per head dim; prints ``fwd:<padded d>=bm,bn,warps,stages`` entries for
``IOATTN_TILES`` (only where a non-default tile wins). Usage: python benchmarks/pick_tiles.py FILE"""
import collections
import json
import math
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
flash = {(r["headdim"], r["causal"], r["seqlen"]): r["tflops"] for r in rows if r["variant"] == "sdpa-flash"}
score = collections.defaultdict(list)
for r in rows:
    if not r["variant"].startswith("sdpa") and r["ok"]:
        score[(r["headdim"], r["variant"])].append(math.log(r["tflops"] / flash[(r["headdim"], r["causal"], r["seqlen"])]))
entries = []
for d in sorted({d for d, _ in score}):
    best = max((v for dd, v in score if dd == d), key=lambda v: sum(score[(d, v)]) / len(score[(d, v)]))
    gm = math.exp(sum(score[(d, best)]) / len(score[(d, best)]))
    print(f"# d={d}: best {best} (geomean {gm:.3f} x sdpa-flash)", file=sys.stderr)
    if not best.endswith("dflt"):
        entries.append(f"fwd:{max(16, 1 << (d - 1).bit_length())}=" + best.rsplit("-", 1)[1].replace(".", ","))
print(";".join(entries))
