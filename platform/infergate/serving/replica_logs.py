"""Logging in a front-end replica: infergate's records in the replica's log file at once,
and a failure that repeats per request logged once per window, with a count.

Pure ``logging``: Ray Serve's handlers are found on its ``ray.serve`` logger.
"""

from __future__ import annotations

import logging
import logging.handlers
import re
import time
from collections.abc import Callable

REPEAT_WINDOW_S = 10.0  # a per-request warning of one kind is logged once per this
# The loggers that write a line per failed request: while Triton is down, every request
# fails, and a thousand lines a second would bury everything else.
REPEATING_LOGGERS = ("infergate.serving.inference", "infergate.http", "infergate.triton.client")
_DIGITS = re.compile(r"\d+")


def log_to_replica_file() -> None:
    """Write infergate's log records to this replica's log file, as Ray Serve does its own.

    Ray Serve gives only its ``ray.serve`` logger a handler in a replica: the records of
    other loggers reached no file, warnings and tracebacks included. Its records wait in a
    buffer (a thousand of them when tuned for throughput, as here) until an error flushes
    it; ours are few and must show when they happen, so they go to the file at once."""
    ours = logging.getLogger("infergate")
    ours.setLevel(logging.INFO)
    ours.propagate = False
    for handler in logging.getLogger("ray.serve").handlers:
        if isinstance(handler, logging.handlers.MemoryHandler) and handler.target is not None:
            handler = handler.target
        if handler not in ours.handlers:
            ours.addHandler(handler)
    for name in REPEATING_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RepeatLimit) for f in logger.filters):
            logger.addFilter(RepeatLimit(REPEAT_WINDOW_S))


class RepeatLimit(logging.Filter):
    """Lets one record of a kind through per ``window_s``; the next one that passes says
    how many were held back. Records of a kind share their message up to its numbers (row
    counts, timings): the same failure of two models makes two kinds."""

    MAX_KINDS = 1000  # a flood of unlike messages must not grow the table without end

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._kinds: dict[str, list[float | int]] = {}  # kind -> [last passed at, held back]

    def filter(self, record: logging.LogRecord) -> bool:
        now = self._clock()
        kind = f"{record.levelno}:{_DIGITS.sub('#', record.getMessage())}"
        seen = self._kinds.get(kind)
        if seen is not None and now - seen[0] < self.window_s:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            record.msg = (
                f"{record.getMessage()} ({seen[1]} more like it were not logged in the "
                f"{now - seen[0]:.0f} s since the last one shown)"
            )
            record.args = ()
        if len(self._kinds) >= self.MAX_KINDS:
            self._kinds = {k: v for k, v in self._kinds.items() if now - v[0] < self.window_s}
            if len(self._kinds) >= self.MAX_KINDS:  # all of them recent: forget the counts
                self._kinds.clear()
        self._kinds[kind] = [now, 0]
        return True
