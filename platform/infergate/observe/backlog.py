"""Requests waiting to be added up: a replica's statistics take them in per window, not
per request (``infergate.observe.telemetry`` and ``infergate.observe.monitor``).

A request only joins the backlog; its owner takes the backlog in when its figures are
read, or the backlog takes itself in once it holds ``MAX_REQUESTS`` requests or
``MAX_TEXTS`` texts, which bounds the memory their predictions keep (1,024-dimensional
embeddings: 8 MB) between reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

MAX_REQUESTS = 512
MAX_TEXTS = 2048
Entry = TypeVar("Entry")


class Backlog(Generic[Entry]):
    """Entries held for ``take_in``, which gets them all at once, in the order added."""

    def __init__(self, take_in: Callable[[list[Entry]], None]) -> None:
        self._take_in = take_in
        self._entries: list[Entry] = []
        self._texts = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, entry: Entry, texts: int) -> None:
        self._entries.append(entry)
        self._texts += texts
        if len(self._entries) >= MAX_REQUESTS or self._texts >= MAX_TEXTS:
            self.take_in()

    def take_in(self) -> None:
        """Hand every entry held to ``take_in`` and start again empty."""
        if not self._entries:
            return
        entries, self._entries, self._texts = self._entries, [], 0
        self._take_in(entries)
