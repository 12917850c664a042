"""The payload log, recording side: which calls a replica keeps, and the thread that
hands them to a writer.

A call is kept or not by one random draw against its role's sample rate
(``PayloadSettings.sample``); a kept call is appended to an in-memory buffer as it is,
the task's answers unencoded. Everything that costs (JSON, hashing, Parquet, the file
system, pruning) happens in the log's own thread, which takes the buffer every
``flush_interval_s`` or once it holds ``flush_records``: the request pays a draw and an
append. A writer slower than the traffic does not grow the buffer for ever: past
``BUFFERED_FLUSHES`` flushes' worth a record is dropped and counted, as mirrors are.

Pure: the writer (``infergate.observe.payload_files``, pyarrow) is imported only when the
log is on.
"""

from __future__ import annotations

import logging
import os
import random
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from infergate.config import PROJECT_ROOT, PayloadSettings
from infergate.versions import CANARY, CHAMPION

log = logging.getLogger(__name__)
SHADOW = "shadow"  # a canary's answer to a mirrored request, which reaches no client
ROLES = (CHAMPION, CANARY, SHADOW)
BUFFERED_FLUSHES = 2  # records held at most: this many flushes' worth
DEFAULT_FOLDER = PROJECT_ROOT / ".infergate" / "payloads"  # the default state dir's


@dataclass(frozen=True)
class Payload:
    """One call as the log keeps it, before encoding. ``role`` is "" when no version was
    picked (the body failed parsing, the model is unknown): then so are ``version`` and
    ``texts`` (None) where the call never got that far."""

    time_s: float  # wall clock, when the answer (or the error) was given
    model: str
    version: str
    role: str
    texts: Sequence[str] | None
    outputs: Any  # the task's answers (as the client got them); None without an answer
    latency_ms: float
    status: int
    key_id: str  # the API key's id, never the key; "" when access control is off
    agreement: Sequence[float] | np.ndarray | None = None  # shadow: per text judged, 0 to 1
    champion_version: str = ""  # shadow: the version whose answer it was compared to
    champion_outputs: Any = None  # ... and that answer


Write = Callable[[list[Payload]], None]
# Texts in, the same texts redacted out (``texts: redact``), run in the log's thread.
Redact = Callable[[list[str]], list[str]]
# What a record keeps of a text that could not be redacted: never the text itself.
UNREDACTED = "[not redacted: dropped]"


class PayloadLog:
    """One replica's payload log. ``write`` stores a batch (a new file each time);
    ``draw`` and ``clock`` are injected for tests."""

    def __init__(
        self,
        settings: PayloadSettings,
        write: Write | None = None,
        *,
        draw: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time,
        redact: Redact | None = None,
    ) -> None:
        """``redact``: with ``texts: redact``, what replaces each text before it is
        written (unset, or failing: ``UNREDACTED`` does)."""
        self.settings = settings
        self._write = write
        self._redact = redact
        self._draw = draw
        self.clock = clock
        self._rates = settings.sample.model_dump()
        self._limit = BUFFERED_FLUSHES * settings.flush_records
        self._held: list[Payload] = []
        self._lock = threading.Lock()  # the event loop appends, the thread takes
        self._due = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.written = 0
        self.dropped = 0  # the buffer was full
        self.failed = 0  # the writer raised: the batch is lost, the log goes on
        self._dropped_told = 0

    @property
    def enabled(self) -> bool:
        return self.settings.enabled and self._write is not None

    @property
    def outcomes(self) -> dict[str, int]:
        """Records by outcome so far, as ``infergate_payload_records_total`` counts them."""
        return {"written": self.written, "dropped": self.dropped, "failed": self.failed}

    @property
    def held(self) -> int:
        return len(self._held)

    def wants(self, role: str) -> bool:
        """Whether to keep one call of ``role`` (a call no version answered: the
        champion's rate, as most calls are the champion's)."""
        if not self.enabled:
            return False
        return self._draw() < self._rates.get(role or CHAMPION, 0.0)

    def add(self, payload: Payload) -> None:
        """Hold ``payload`` for the next flush; never blocks on I/O. A closed log (its
        settings replaced while a mirror was under way) takes nothing more."""
        with self._lock:
            if self._closed:
                return
            if len(self._held) >= self._limit:
                self.dropped += 1
                return
            self._held.append(payload)
            full = len(self._held) >= self.settings.flush_records
        if full:
            self._due.set()

    def flush(self) -> int:
        """Write what is held as one batch (the log's thread calls this; so may a test);
        how many records were written."""
        with self._lock:
            batch, self._held = self._held, []
        if self.dropped > self._dropped_told:
            log.warning("payload log: %d records dropped, the writer fell behind", self.dropped)
            self._dropped_told = self.dropped
        if not batch or self._write is None:
            return 0
        try:
            if self.settings.texts == "redact":
                batch = self._redacted(batch)
            self._write(batch)
        except Exception:  # a full disk, an object store away: lose this batch, not the log
            self.failed += len(batch)
            log.exception("payload log: writing %d records failed", len(batch))
            return 0
        self.written += len(batch)
        return len(batch)

    def _redacted(self, batch: list[Payload]) -> list[Payload]:
        """``batch`` with its texts redacted, in one call for all of them."""
        given = [list(p.texts) if p.texts is not None else [] for p in batch]
        texts = [text for texts in given for text in texts]
        if not texts:
            return batch
        try:
            if self._redact is None:
                raise RuntimeError("no redaction model is wired to the log")
            redacted = iter(self._redact(texts))
        except Exception as exc:  # the model away, not served, of the wrong task
            log.warning("payload log: redacting %d texts failed, they are dropped: %s",
                        len(texts), exc)  # fmt: skip
            redacted = iter([UNREDACTED] * len(texts))
        return [
            p if p.texts is None else replace(p, texts=[next(redacted) for _ in p.texts])
            for p in batch
        ]

    def start(self) -> None:
        """Flush from a thread of the log's own from now on."""
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="payload-log", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float | None = None) -> None:
        """Write what is held and stop the thread; waits up to ``timeout_s`` for it
        (None: does not wait, so the event loop never does)."""
        self._closed = True
        self._due.set()
        if self._thread is None:
            return
        if timeout_s is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._closed:
            self._due.wait(self.settings.flush_interval_s)
            self._due.clear()
            self.flush()
        self.flush()  # what arrived while the last batch was written


def replica_name() -> str:
    """A name no other replica's files carry: host, process and a random part (a
    restarted process may reuse its pid)."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def open_payload_log(
    settings: PayloadSettings, replica: str | None = None, redact: Redact | None = None
) -> PayloadLog:
    """The log ``settings`` ask for, its thread started (``redact``: see
    :class:`PayloadLog`); a log that keeps nothing when they turn it off."""
    if not settings.enabled:
        return PayloadLog(settings)
    from infergate.observe.payload_files import PayloadWriter  # pyarrow: only when on

    url = settings.url or str(DEFAULT_FOLDER)
    writer = PayloadWriter(
        url, replica or replica_name(), texts=settings.texts, max_total_mb=settings.max_total_mb
    )
    payloads = PayloadLog(settings, writer, redact=redact)
    payloads.start()
    log.info("payload log: writing to %s as %s", url, writer.replica)
    return payloads


NO_PAYLOADS = PayloadLog(PayloadSettings())
