"""Argument types of the command line (``argparse`` ``type=``): each returns the value or raises
``argparse.ArgumentTypeError`` with what it expected, which argparse prints beside the option."""
from __future__ import annotations

import argparse


def int_list(minimum: int | None = None):
    """The type of a comma-separated list of integers, each at least ``minimum`` (None: any; the
    command checks them itself)."""
    def parse(text):
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
        if minimum is not None and min(values) < minimum:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers >= {minimum}, got {text!r}")
        return values
    return parse


def positive_int(text):
    return _int_at_least(text, 1)


def non_negative_int(text):
    return _int_at_least(text, 0)


def _int_at_least(text, minimum):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
    return value


def probability(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1], got {text!r}")
    return value
