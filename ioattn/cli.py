"""The ``ioattn`` command line, from one argparse definition (help, errors and dispatch alike):

    ioattn --version
    ioattn bench [SWEEP] [options]      SWEEP: train, memory, quick (the default), decode, mla or latency
    ioattn bench report RESULTS.jsonl [--out DIR]
    ioattn bench STUDY [options]        STUDY: fp8-accuracy or fp4-study (float64 emulation)
    ioattn io --seqlen N --headdim D [options]   the IO model: predicted HBM bytes, FLOPs, time bound
    ioattn explain --out DIR [--pages N,N] [--open]   the explainer pages (ioattn.explainers)

The sweeps themselves (their sizes, providers, which run without a GPU) are defined in
``ioattn.bench.run``, the accuracy studies in their own modules (``STUDIES``); the texts here are
generated from those definitions, so they cannot drift.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Callable

from ioattn.bench import arg_types, fp4_study, fp8_accuracy, io_command, mods_bench, pingpong_trace, report
from ioattn.bench import run as sweeps
from ioattn.bench.providers import DECODE_OURS, DECODE_PEERS, OURS, PEERS
from ioattn.explainers import SLOTS as EXPLAINER_PAGES

ALL = tuple(sweeps.SWEEP_HELP)
# the accuracy studies: each module has NAME, HELP, add_arguments(parser) and run(args)
STUDIES = {m.NAME: m for m in (fp8_accuracy, fp4_study, mods_bench, pingpong_trace)}
DEFAULT_SWEEP = "quick"
WIDTH = 100  # the hand-made parts of the help (sweep lists, defaults) are wrapped to this


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors about unknown options also list the options it takes."""

    def error(self, message):
        if message.startswith("unrecognized arguments"):
            message += "\nvalid options here: " + ", ".join(option_names(self))
        super().error(message)


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help layout, without breaking names such as sdpa-math at their hyphen."""

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def _fill(text, indent):
    return textwrap.fill(text, WIDTH, subsequent_indent=indent, break_on_hyphens=False)


def option_names(parser):
    """Every option string ``parser`` takes (``-h``, ``--help`` included), in definition order."""
    return [s for a in parser._actions for s in a.option_strings]


_ints = arg_types.int_list(1)


def _names(text):
    return [x.strip() for x in text.split(",") if x.strip()]


def _listed(values):
    return ",".join(str(v) for v in values)


def _per_device(sweep, describe):
    """``describe(definition)`` of ``sweep`` on a GPU and on the CPU, where it runs there."""
    parts = [f"{label} {describe(sd)}" for device, label in (("cuda", "GPU"), ("cpu", "CPU"))
             if (sd := sweeps.sweep_table(sweep, device)) is not None]
    return "; ".join(parts)


@dataclass(frozen=True)
class Option:
    """One option of the bench sweeps: its flags, the sweeps that take it, its help for one sweep
    (``help(None)``: the summary in ``ioattn bench --help``), which always names the default."""
    flags: tuple
    sweeps: tuple
    help: Callable
    kwargs: dict = field(default_factory=dict)


def _seqlens_help(s):
    if s in sweeps.DECODE_SWEEPS:
        return "the same as --kvlens (default: the sweep's own cases)"
    if s is None:
        return "comma-separated sequence lengths (default: the sweep's own; longer ones on request)"
    return f"comma-separated sequence lengths (default: {_per_device(s, lambda sd: _listed(sd.seqlens))})"


def _providers_help(s):
    if s is None:
        return (f"comma-separated providers to run (default: the sweep's own); peers: {', '.join(PEERS)}; "
                "ours: ioattn and its variants (ioattn bench SWEEP --help lists them)")
    return (f"comma-separated providers to run (default: {_per_device(s, lambda sd: _listed(sd.providers))}); "
            f"known: {', '.join(_known_providers(s))}")


OPTIONS = (
    Option(("--dtype",), ALL, lambda s: "element type of q, k, v (default: fp32 on the CPU, bf16 on a GPU)",
           dict(choices=list(sweeps.DTYPES), default=None)),
    Option(("--providers",), ALL, _providers_help, dict(type=_names, metavar="A,B")),
    Option(("--headdims",), ALL, lambda s: "comma-separated head dims (default: "
           + ("the sweep's own" if s is None else _per_device(s, lambda sd: _listed(sd.headdims))) + ")",
           dict(type=_ints, metavar="D,D")),
    Option(("--seqlens",), ALL, _seqlens_help, dict(type=_ints, metavar="N,N")),
    Option(("--batches",), sweeps.DECODE_SWEEPS, lambda s: "comma-separated batch sizes: the cases become every one of "
           "them with every KV length (--kvlens, or the sweep's) (default: the sweep's own cases)",
           dict(type=_ints, metavar="B,B")),
    Option(("--kvlens",), sweeps.DECODE_SWEEPS, lambda s: "comma-separated KV lengths: the cases become every one of them "
           "with every batch size (--batches, or 1) (default: the sweep's own cases)",
           dict(type=_ints, metavar="N,N")),
    Option(("--rounds",), ("train", "quick", *sweeps.DECODE_SWEEPS, "latency"), lambda s: "interleaved timing rounds "
           "per point, the median of their medians reported (default: "
           f"{sweeps.DECODE_ROUNDS if s in sweeps.DECODE_SWEEPS else sweeps.TIME_ROUNDS}, "
           "on a GPU and on the CPU)",
           dict(type=int, default=None, metavar="R")),
    Option(("--layout",), ("train", "quick", "memory", "latency"), lambda s: "memory layout of q, k, v: three tensors, the "
           "views of one packed (batch, seqlen, 3, heads, d) tensor (as flash_attn_qkvpacked_func takes them), or "
           "three (batch, heads, seqlen, d) tensors transposed (default: separate)",
           dict(choices=sweeps.LAYOUTS, default="separate")),
    Option(("--out",), ALL, lambda s: "directory for results.jsonl and the plots (default: none, nothing is "
           "written)", dict(default=None, metavar="DIR")),
)


def _sweep_line(name):
    return sweeps.SWEEP_HELP[name] + (" [needs a GPU]" if sweeps.needs_gpu(name) else "")


def _describe(sd):
    """What one sweep definition measures, in words."""
    if isinstance(sd, sweeps.DecodeSweep):
        cases = " ".join(f"{b}x{n}" for b, n in sd.cases)
        dims = _listed(sd.headdims) + (f" (V {sd.headdim_v}{', its first columns' if sd.latent else ''})"
                                        if sd.headdim_v else "")
        return (f"{sd.nheads} query heads, {sd.nheads_kv} KV heads, head dims {dims}, "
                f"(batch x KV length) cases {cases}; providers {', '.join(sd.providers)}")
    batch = "batch 1" if not sd.tokens else f"batch {sd.tokens} tokens / sequence length"
    causal = {(False,): "not causal", (True,): "causal"}.get(tuple(sd.causal), "not causal and causal")
    what = "peak memory of forward+backward" if sd.memory else f"modes {', '.join(sd.modes)}"
    return (f"head dims {_listed(sd.headdims)}, sequence lengths {_listed(sd.seqlens)}, {batch}, "
            f"heads {sd.hidden} / head dim, {causal}, {what}; providers {', '.join(sd.providers)}")


def _sweep_epilog(name):
    lines = []
    for device, label in (("cuda", "on a GPU"), ("cpu", "on the CPU")):
        sd = sweeps.sweep_table(name, device)
        lines.append(f"{label}: " + (_describe(sd) if sd else "does not run (needs a GPU)"))
    if name != "memory":
        lines.append("Before timing, each provider is checked against the float64 oracle (the output, and its "
                     "gradients where a backward is timed): one verdict line per provider and configuration, then "
                     "a summary line.")
    return "\n".join(_fill(ln, "  ") for ln in lines)


def _sweeps_listing():
    names = [*ALL, "report", *STUDIES]
    width = max(map(len, names)) + 2
    helps = {**{n: _sweep_line(n) for n in ALL}, "report": report.REPORT_HELP,
             **{n: m.HELP for n, m in STUDIES.items()}}
    lines = [f"  {n:<{width}}{helps[n]}" for n in names]
    return "\n".join(_fill(ln, " " * (width + 2)) for ln in lines)


def _here():
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    where = "a GPU" if device == "cuda" else "no GPU"
    return device, f"This machine: {where}; the sweeps that run here: {', '.join(sweeps.sweeps_on(device))}."


def _options_listing():
    """Every option of the sweeps, its default, and which sweeps take it."""
    lines = []
    for opt in OPTIONS:
        choices = opt.kwargs.get("choices")
        arg = "{" + ",".join(choices) + "}" if choices else opt.kwargs.get("metavar", "")
        takers = "all sweeps" if opt.sweeps == ALL else ", ".join(opt.sweeps)
        text = f"  {' '.join(opt.flags)} {arg}: {opt.help(None)} [{takers}]"
        lines.append(_fill(text, "      "))
    return "\n".join(lines)


def _study_options_listing(parsers):
    """Every option of the studies' parsers ({name: parser}) with its help and the studies that take it."""
    takers = {}
    for name, parser in parsers.items():
        for a in parser._actions:
            if a.option_strings and a.dest != "help":
                arg = f" {a.metavar}" if a.metavar else ""
                takers.setdefault(f"{' '.join(a.option_strings)}{arg}: {a.help}", []).append(name)
    every = list(parsers)
    return "\n".join(_fill(f"  {text} [{'all studies' if names == every else ', '.join(names)}]", "      ")
                     for text, names in takers.items())


def version_text():
    """``ioattn X.Y.Z`` and, on the next line, the versions of PyTorch and Triton it runs with."""
    from importlib import metadata

    import ioattn

    def dist(name):
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            return f"{name} not installed"
    return f"ioattn {ioattn.__version__}\n{dist('torch')}, {dist('triton')}"


def build_parser():
    """The whole command line: ``ioattn`` > ``bench`` > one parser per sweep and ``report``."""
    raw = Formatter
    top = Parser(prog="ioattn", formatter_class=raw,
                 description="ioattn: exact, IO-aware attention for PyTorch, with flash-attn's API.",
                 epilog=f"sweeps of ioattn bench (ioattn bench SWEEP --help for one):\n{_sweeps_listing()}")
    top.add_argument("--version", action="version", version=version_text(),
                     help="print ioattn's version and PyTorch's and Triton's, then exit")
    commands = top.add_subparsers(dest="command", metavar="COMMAND", title="commands", parser_class=Parser,
                                 help="ioattn COMMAND --help: its own help")
    bench = commands.add_parser(
        "bench", formatter_class=raw, help="benchmark ioattn against its peers: correctness first, then time or "
        f"memory (SWEEP: {', '.join(ALL)} or report; default {DEFAULT_SWEEP})",
        description=_fill("Benchmark ioattn against its peers: every provider checked against the float64 "
                                  "oracle, then timed (or its memory measured), one JSON record per measurement.", ""))
    subs = bench.add_subparsers(dest="sweep", metavar="SWEEP", title=f"sweeps (default: {DEFAULT_SWEEP})",
                                parser_class=Parser, help="ioattn bench SWEEP --help: its sizes and options")
    for name in ALL:
        sub = subs.add_parser(name, help=_sweep_line(name), description=_sweep_line(name),
                              epilog=_sweep_epilog(name), formatter_class=raw)
        for opt in OPTIONS:
            if name in opt.sweeps:
                sub.add_argument(*opt.flags, help=opt.help(name), **opt.kwargs)
        sub.set_defaults(handler=_bench, parser=sub)
    rep = report.add_arguments(subs.add_parser("report", help=report.REPORT_HELP, description=report.REPORT_HELP))
    rep.set_defaults(handler=_report, parser=rep)
    studies = {}
    for name, study in STUDIES.items():
        sub = study.add_arguments(subs.add_parser(name, help=study.HELP, description=_fill(study.HELP, ""),
                                                  formatter_class=raw))
        sub.set_defaults(handler=_study, parser=sub, study=study)
        studies[name] = sub
    _add_explain(commands)
    bench.epilog = (f"SWEEP may be left out: \"ioattn bench --out DIR\" is \"ioattn bench {DEFAULT_SWEEP} --out DIR\".\n"
                    f"{_here()[1]}\n\noptions of the sweeps (ioattn bench SWEEP --help: that sweep's defaults):\n"
                    f"{_options_listing()}\n\noptions of the accuracy studies ({', '.join(STUDIES)}):\n"
                    f"{_study_options_listing(studies)}")
    io = io_command.add_arguments(commands.add_parser(io_command.NAME, help=io_command.HELP, formatter_class=raw,
                                                      description=_fill(io_command.DESCRIPTION, "")))
    io.set_defaults(handler=io_command.run, parser=io)
    return top


EXPLAIN_HELP = ("write interactive pages that explain FlashAttention on ioattn's own numbers (self-contained "
                "HTML, computed at build time) into an empty or new folder")


def _add_explain(commands):
    """``ioattn explain --out DIR [--pages N,N] [--open]``."""
    pages = ",".join(str(s.number) for s in EXPLAINER_PAGES)
    sub = commands.add_parser("explain", help=EXPLAIN_HELP, description=_fill(EXPLAIN_HELP + ".", ""),
                              formatter_class=Formatter)
    sub.add_argument("--out", required=True, metavar="DIR",
                     help="the folder for index.html and the pages; it must be empty or not exist yet, and "
                     "nothing in it is overwritten or removed (required: no default)")
    sub.add_argument("--pages", type=_ints, default=None, metavar="N,N",
                     help=f"comma-separated page numbers (default: every page written so far, {pages})")
    sub.add_argument("--open", action="store_true",
                     help="open index.html in the web browser afterwards (default: off)")
    sub.set_defaults(handler=_explain, parser=sub)


def _explain(args):
    """Refuse a bad --pages or --out before anything is computed; build; open the index if asked."""
    import webbrowser

    from ioattn.explainers import site
    try:
        paths = site.build(args.out, args.pages)
    except ValueError as e:
        args.parser.error(str(e))
    except OSError as e:
        print(f"ioattn explain: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {len(paths)} files to {args.out}: {', '.join(p.name for p in paths)}")
    if args.open and not webbrowser.open(paths[0].resolve().as_uri()):
        print(f"no web browser found; open {paths[0].resolve()} yourself")
    return 0


def _with_default_sweep(argv):
    """``bench`` followed by options (or nothing) runs the default sweep."""
    if argv[:1] == ["bench"] and (len(argv) == 1 or (argv[1].startswith("-") and argv[1] not in ("-h", "--help"))):
        return ["bench", DEFAULT_SWEEP, *argv[1:]]
    return argv


def _known_providers(sweep):
    return DECODE_OURS + DECODE_PEERS if sweep in sweeps.DECODE_SWEEPS else OURS + PEERS


def _bench(args):
    """Refuse what cannot run here before anything is measured or written; then run the sweep."""
    parser, device = args.parser, _here()[0]
    if getattr(args, "rounds", None) is not None and args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    unknown = [p for p in args.providers or () if p not in _known_providers(args.sweep)]
    if unknown:
        parser.error(f"unknown provider {unknown[0]!r}; known: {', '.join(_known_providers(args.sweep))}")
    if device != "cuda" and sweeps.needs_gpu(args.sweep):
        parser.error(f"the {args.sweep} sweep needs a GPU and this machine has none (torch.cuda.is_available() "
                     f"is False); sweeps that run here: {', '.join(sweeps.sweeps_on(device))}")
    from ioattn.bench.command import run_bench
    return run_bench(args, device)


def _report(args):
    return report.run(args)


def _study(args):
    return args.study.run(args)


def main(argv=None):
    argv = _with_default_sweep(list(sys.argv[1:] if argv is None else argv))
    top = build_parser()
    args, extra = top.parse_known_args(argv)
    if extra:
        getattr(args, "parser", top).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        top.print_help()
        return 0
    args.argv = argv
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
