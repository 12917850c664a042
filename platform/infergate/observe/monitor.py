"""Per-version statistics a front-end replica keeps.

- drift of live traffic against the registration reference, published as gauges;
- request counters (``infergate.observe.counters``) that the control plane's canary analysis reads.

Drift gauges are published at most once per ``publish_interval_s``; the counters are
read by the replica's sync loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from infergate import tasks
from infergate.observe.counters import VersionCounters
from infergate.observe.drift import DriftWindow
from infergate.observe.telemetry import Telemetry
from infergate.serving.runtime import ModelRuntime, Prediction


class Monitors:
    def __init__(
        self,
        telemetry: Telemetry,
        *,
        publish_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.telemetry = telemetry
        self.publish_interval_s = publish_interval_s
        self.clock = clock
        self.windows: dict[tuple[str, str], DriftWindow] = {}
        self.counters: dict[str, VersionCounters] = {}
        self._published_at = float("-inf")
        self._published: dict[tuple[str, str], set[tuple[str, str]]] = {}

    def record(
        self,
        runtime: ModelRuntime,
        status: int,
        seconds: float,
        prediction: Prediction | None,
    ) -> None:
        """One request answered (or failed) by ``runtime``'s version."""
        served = runtime.served
        counters = self.version_counters(runtime)
        figures = None
        if prediction is None:
            counters.count(status, seconds, None)
        else:
            task = tasks.get(runtime.spec.task)
            figures = prediction.figures or task.figures(
                prediction.raw, prediction.batch, prediction.labels
            )
            shares, classes = task.counter_shares(
                figures, prediction.raw, prediction.batch, prediction.labels
            )
            counters.count(status, seconds, shares, classes)
        if prediction is not None and runtime.reference:
            window = self.windows.get((served.name, served.version))
            if window is None:
                window = DriftWindow(runtime.reference, runtime.spec.task, clock=self.clock)
                self.windows[(served.name, served.version)] = window
            batch = prediction.batch
            window.add(batch.lengths, batch.unknown_ratio, prediction.raw, figures=figures)
        now = self.clock()
        if now - self._published_at >= self.publish_interval_s:
            self._published_at = now
            self.publish()

    def version_counters(self, runtime: ModelRuntime) -> VersionCounters:
        """The counters of ``runtime``'s version, which the control plane reads."""
        key = f"{runtime.served.name}/{runtime.served.version}"
        return self.counters.setdefault(key, VersionCounters())

    def publish(self) -> None:
        for key, counters in self.counters.items():
            shadow = counters.shadow
            if shadow.requests or shadow.dropped:  # a canary in shadow, now or before
                model, version = key.rsplit("/", 1)
                self.telemetry.shadow(model, version, shadow)
        for (model, version), window in self.windows.items():
            scores = window.scores()
            published = self._published.setdefault((model, version), set())
            # A drained window has no scores: publish NaN (no data) rather than leave the
            # last values standing, which would keep a drift alert firing on old traffic.
            stale = {key: float("nan") for key in published - set(scores)}
            if scores or stale:
                self.telemetry.drift(model, version, {**scores, **stale})
            published |= set(scores)
