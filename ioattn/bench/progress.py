"""Progress of a sweep on stderr, with the time left estimated from the work done so far.

On a terminal: one bar, redrawn in place, cleared before every log line so the two never mix.
Anywhere else (a file, a pipe, a CI log): no bar, only a plain line now and then, so a captured
log stays readable.
"""
from __future__ import annotations

import shutil
import sys
import time

PLAIN_EVERY_S = 30.0  # off a terminal: at most one progress line per this many seconds
BAR_WIDTH = 24


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """Steps of known relative cost (``weight``: e.g. the FLOPs of a point) out of ``total``; the
    time left is the elapsed time scaled by the weight still to do over the weight done, so a
    sweep whose later points are larger is not promised an early end."""

    def __init__(self, total: float, stream=None, clock=time.monotonic):
        self.total, self.done, self.steps = max(float(total), 1e-9), 0.0, 0
        self.stream = sys.stderr if stream is None else stream
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.clock = clock
        self.start = self.last_plain = clock()
        self.shown, self.what = False, None

    def left_s(self):
        """Estimated seconds left, or None before the first step."""
        if self.done <= 0:
            return None
        return (self.clock() - self.start) * max(self.total - self.done, 0.0) / self.done

    def step(self, what: str, weight: float = 1.0):
        self.done += weight
        self.steps += 1
        if self.tty:
            self._draw(what)
        elif self.clock() - self.last_plain >= PLAIN_EVERY_S:
            self.last_plain = self.clock()
            self.stream.write(f"progress: {self._summary()}\n")
            self.stream.flush()

    def _summary(self):
        left = self.left_s()
        pct = 100.0 * min(self.done / self.total, 1.0)
        tail = "" if left is None else f", about {duration(left)} left"
        return f"{pct:3.0f}% after {duration(self.clock() - self.start)}{tail}"

    def _draw(self, what):
        self.what = what
        filled = int(BAR_WIDTH * min(self.done / self.total, 1.0))
        line = f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self._summary()}  {what}"
        width = shutil.get_terminal_size((100, 20)).columns - 1
        self.stream.write("\r" + line[:width].ljust(width))
        self.stream.flush()
        self.shown = True

    def clear(self):
        """Erase the bar (a log line is about to be printed)."""
        if self.shown:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r" + " " * width + "\r")
            self.stream.flush()
            self.shown = False

    def wrap(self, log):
        """``log`` that clears the bar first and draws it again below the line."""
        def cleared(line):
            self.clear()
            log(line)
            if self.tty and self.what is not None:
                self._draw(self.what)
        return cleared

    def close(self):
        self.clear()
