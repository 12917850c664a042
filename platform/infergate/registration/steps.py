"""The named steps of a long piece of work (a registration's load, export, quantisation,
parity...): a progress bar on stderr when asked for, and each step's seconds for the log."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Sequence
from types import TracebackType

from tqdm import tqdm


class Steps:
    """``with Steps("model", ("load", "save"), progress) as steps:`` then
    ``with steps("load"): ...`` for each step, in order."""

    def __init__(self, subject: str, names: Sequence[str], progress: bool) -> None:
        self.subject = subject
        self.timings: dict[str, float] = {}
        self._bar = tqdm(total=len(names), unit="step", file=sys.stderr, disable=not progress)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.describe(name)
        start = time.perf_counter()
        yield
        self.timings[name] = time.perf_counter() - start
        self._bar.update()

    def describe(self, doing: str) -> None:
        """Show what the work is doing now (a step, or a part of one)."""
        self._bar.set_description(f"{self.subject}: {doing}")

    def summary(self) -> str:
        """``load 1.2 s, save 0.1 s``: each step done and its seconds."""
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.timings.items())

    def __enter__(self) -> Steps:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._bar.close()
