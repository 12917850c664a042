"""Redacting the payload log's texts with a served token-classification model.

With ``payloads.texts: redact`` a replica's payload log hands each batch's texts to a
:class:`Redactor` before writing them: the champion of ``payloads.redact_model`` (e.g.
the demo's PII model) answers them as it answers clients, through the same batcher and
Triton, and each entity it finds is replaced by its type (``Task.redacted``). The log's
thread waits for the answer; the work runs on the replica's event loop, a sampled
share of the traffic at most. A text that cannot be redacted is never written as it is
(``infergate.observe.payloads.UNREDACTED``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from infergate.errors import BackendUnavailable
from infergate.serving.batching import Backend
from infergate.serving.runtime import ModelRuntime

REDACT_TIMEOUT_S = 10.0  # one batch of the log's texts, all chunks


class Redactor:
    """``champion(name)`` finds the model's champion runtime in the replica's current
    table (None when it serves none); ``backend()`` the current Triton batcher."""

    def __init__(
        self,
        model: str,
        champion: Callable[[str], ModelRuntime | None],
        backend: Callable[[], Backend | None],
        loop: asyncio.AbstractEventLoop,
        *,
        chunk: int,
    ) -> None:
        self.model = model
        self._champion, self._backend = champion, backend
        self._loop = loop
        self._chunk = chunk  # texts per model call: the front-end's own limit

    def __call__(self, texts: list[str]) -> list[str]:
        """``texts`` redacted; from a thread other than the loop's."""
        future = asyncio.run_coroutine_threadsafe(self.redacted(texts), self._loop)
        return future.result(timeout=REDACT_TIMEOUT_S)

    async def redacted(self, texts: list[str]) -> list[str]:
        runtime, backend = self._champion(self.model), self._backend()
        if runtime is None or backend is None:
            raise BackendUnavailable(f"the redaction model {self.model!r} is not served here")
        redacted: list[str] = []
        for start in range(0, len(texts), self._chunk):
            part = texts[start : start + self._chunk]
            prediction = await runtime.predict(part, {}, backend)
            redacted += [
                runtime.task.redacted(text, answer)
                for text, answer in zip(part, prediction.outputs, strict=True)
            ]
        return redacted
