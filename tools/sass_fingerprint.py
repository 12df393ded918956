"""A fingerprint of each Gluon Hopper build's SASS (compiled for sm_90 without a GPU), to show that a
refactor left the measured kernels unchanged: run it before and after, and compare the lines.
Addresses are dropped; the instructions, their operands and their order count.

    python tools/sass_fingerprint.py [--pass fwd|bwd|both] [--variants persistent] [--headdims 64,128]
        [--masks 0,1] [--walk-table default|on|off]

``--variants`` names the forward's variants; the backward fingerprints its dispatched variant (ws).
"""
import argparse
import hashlib
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_check_hopper as cc  # noqa: E402
import compile_check_hopper_bwd as cc_bwd  # noqa: E402
from gluon_aot import sass_text  # noqa: E402

from ioattn.plan import hopper  # noqa: E402


def fingerprint(kernel) -> tuple:
    """(sha1 of the SASS instructions without their addresses, instruction count)."""
    lines = [re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).strip()
             for line in sass_text(kernel.asm["cubin"]).splitlines() if line.strip().startswith("/*")]
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:12], len(lines)


def _wanted(d, headdims):
    return not headdims or str(d) in headdims.split(",")


def forward(args):
    table = None if args.walk_table == "default" else args.walk_table == "on"
    for variant in args.variants.split(","):
        for d in hopper.TILE_TABLE[variant]:
            if not _wanted(d, args.headdims):
                continue
            for causal in (bool(int(m)) for m in args.masks.split(",")):
                with hopper.walk_table(table):
                    _, kernel = cc.compile_one(variant, d, "bf16", causal)
                digest, count = fingerprint(kernel)
                print(f"fwd {variant} d={d} causal={causal} walk_table={args.walk_table}: {digest} ({count} instructions)")


def backward(args):
    for d in cc_bwd.BWD_VARIANT_HEADDIMS["ws"]:
        if not _wanted(d, args.headdims):
            continue
        for causal in (bool(int(m)) for m in args.masks.split(",")):
            _, kernel = cc_bwd.compile_one("ws", d, "bf16", causal)
            digest, count = fingerprint(kernel)
            print(f"bwd ws d={d} causal={causal}: {digest} ({count} instructions)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pass", dest="pass_", default="fwd", choices=("fwd", "bwd", "both"))
    ap.add_argument("--variants", default="persistent")
    ap.add_argument("--headdims", default=None, help="comma-separated subset of each variant's head dims")
    ap.add_argument("--masks", default="0,1")
    ap.add_argument("--walk-table", default="default", choices=("default", "on", "off"))
    args = ap.parse_args()
    if args.pass_ in ("fwd", "both"):
        forward(args)
    if args.pass_ in ("bwd", "both"):
        backward(args)


if __name__ == "__main__":
    main()
