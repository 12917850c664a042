"""Shadow traffic: a share of a champion's requests sent again to its canary in shadow,
after the client has its answer, and the two answers compared (``Task.compare``).

The client never waits for the mirror and never sees its answer: the copy starts as a
task of its own once the champion's prediction is ready and the handler goes on to
render it. At most ``limit`` mirrors are under way per replica; one more is dropped and
counted, so a canary that slows down (or load that grows) costs the replica a bounded
amount of work. What the comparison finds goes to the canary's counters
(``ShadowCounters``), which the control plane's shadow analysis reads
(``infergate.control.shadow``); a sample of the canary's answers, each with the
champion's it was compared to, goes to the payload log (role ``shadow``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from infergate.errors import InfergateError
from infergate.observe.counters import ShadowCounters, VersionCounters
from infergate.observe.payloads import NO_PAYLOADS, SHADOW, Payload, PayloadLog
from infergate.serving.batching import Backend
from infergate.serving.routing import ServedModel
from infergate.serving.runtime import ModelRuntime, Prediction
from infergate.tasks import Comparison, Paired
from infergate.versions import CHAMPION

log = logging.getLogger(__name__)
MIRRORS_UNDER_WAY = 8  # per replica


class Mirror:
    """Mirrors champion requests to canaries in shadow, one replica's worth."""

    def __init__(
        self,
        counters: Callable[[ModelRuntime], VersionCounters],
        *,
        limit: int = MIRRORS_UNDER_WAY,
        draw: Callable[[], float] = random.random,
        payloads: PayloadLog = NO_PAYLOADS,
    ) -> None:
        """``counters``: the counters of a version, where the comparisons are added;
        ``payloads``: the log a sample of the canary's answers goes to."""
        self._counters = counters
        self.payloads = payloads
        self.limit = limit
        self._draw = draw
        self._under_way: set[asyncio.Task[None]] = set()
        self._comparisons: dict[tuple[str, str, str], Comparison] = {}

    @property
    def under_way(self) -> int:
        return len(self._under_way)

    def offer(
        self,
        model: ServedModel,
        answered: Prediction,
        by: ModelRuntime,
        texts: list[str],
        parameters: dict[str, Any],
        backend: Backend,
        key_id: str = "",
    ) -> None:
        """Mirror one request ``by`` the champion answered (for the API key ``key_id``),
        if the model has a canary in shadow and the draw says so; never waits."""
        canary = model.shadow
        if canary is None or by.served.role != CHAMPION or canary.served.shadow is None:
            return
        if self._draw() >= canary.served.shadow.share:
            return
        if len(self._under_way) >= self.limit:
            self._shadow(canary).dropped += 1
            return
        task = asyncio.get_running_loop().create_task(
            self._compare(canary, by, answered, texts, parameters, backend, key_id)
        )
        self._under_way.add(task)  # a strong reference until it is done
        task.add_done_callback(self._under_way.discard)

    async def _compare(
        self,
        canary: ModelRuntime,
        champion: ModelRuntime,
        answered: Prediction,
        texts: list[str],
        parameters: dict[str, Any],
        backend: Backend,
        key_id: str,
    ) -> None:
        await asyncio.sleep(0)  # the client's answer first
        shadow = self._shadow(canary)
        logged = Logged(self.payloads, canary, champion, answered, texts, key_id)
        try:
            prediction = await canary.predict(texts, parameters, backend)
            paired = self._comparison(canary, champion)(answered, prediction, texts)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the canary's failure, whatever it is: it counts
            logged.record(exc.status if isinstance(exc, InfergateError) else 500)
            if not isinstance(exc, InfergateError) or exc.status >= 500:
                log.info("canary %s failed a mirrored request: %s", canary.triton_model, exc)
                shadow.requests += 1
                shadow.errors += 1
                shadow.texts += len(texts)
                shadow.disagreement += len(texts)
            return  # a 4xx the champion did not give: its parameters; not judged
        logged.record(200, prediction, paired)
        add(shadow, paired)
        seconds = (prediction.timings.total_s(), answered.timings.total_s())
        if canary.served.shadow is not None and canary.served.shadow.slower(*seconds):
            shadow.slower += 1

    def _comparison(self, canary: ModelRuntime, champion: ModelRuntime) -> Comparison:
        key = (canary.served.name, canary.served.version, champion.served.version)
        comparison = self._comparisons.get(key)
        if comparison is None:
            # One canary at a time per model: the last one's window is of no use.
            self._comparisons = {k: c for k, c in self._comparisons.items() if k[0] != key[0]}
            comparison = self._comparisons[key] = canary.task.comparison()
        return comparison

    def _shadow(self, canary: ModelRuntime) -> ShadowCounters:
        return self._counters(canary).shadow


class Logged:
    """One mirrored request on its way to the payload log, timed from its start."""

    def __init__(
        self,
        payloads: PayloadLog,
        canary: ModelRuntime,
        champion: ModelRuntime,
        answered: Prediction,
        texts: list[str],
        key_id: str,
    ) -> None:
        self.payloads, self.canary, self.champion = payloads, canary, champion
        self.answered, self.texts, self.key_id = answered, texts, key_id
        self.start = time.perf_counter()

    def record(
        self, status: int, prediction: Prediction | None = None, paired: Paired | None = None
    ) -> None:
        if not self.payloads.wants(SHADOW):
            return
        served = self.canary.served
        self.payloads.add(
            Payload(
                self.payloads.clock(), served.name, served.version, SHADOW, self.texts,
                None if prediction is None else prediction.outputs,
                (time.perf_counter() - self.start) * 1000, status, self.key_id,
                agreement=None if paired is None else paired.agreement,
                champion_version=self.champion.served.version,
                champion_outputs=self.answered.outputs,
            )
        )  # fmt: skip


def add(shadow: ShadowCounters, paired: Paired) -> None:
    """One mirrored request the canary answered, compared text by text."""
    shadow.requests += 1
    shadow.texts += len(paired.agreement)
    shadow.disagreement += float((1.0 - paired.agreement).sum())
    shadow.largest_change = max(shadow.largest_change, paired.change)
