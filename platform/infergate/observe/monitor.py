"""Per-version statistics a front-end replica keeps.

- drift of live traffic against the registration reference, published as gauges;
- request counters (``infergate.observe.counters``) that the control plane's canary analysis reads.

Drift gauges are published at most once per ``publish_interval_s``; the counters are
read by the replica's sync loop. A request only joins a backlog (:meth:`Monitors.record`,
``infergate.observe.backlog``); the counters and drift windows take it in when they are
read (a publish, the counters' report) or once it is full: one drift window update and
one latency count per version for all of them, rather than a dozen small numpy calls per
request. What they read is what they would have read had each request been added at
once: the same counts, the same texts with the same times in each window.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from infergate import tasks
from infergate.observe.backlog import Backlog
from infergate.observe.counters import VersionCounters
from infergate.observe.drift import DriftWindow
from infergate.observe.telemetry import Telemetry
from infergate.serving.runtime import ModelRuntime, Prediction
from infergate.tasks import Figures

log = logging.getLogger(__name__)
Pending = tuple[ModelRuntime, int, float, Prediction | None, float]


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
        self._windows: dict[tuple[str, str], DriftWindow] = {}
        self._counters: dict[str, VersionCounters] = {}
        self._backlog: Backlog[Pending] = Backlog(self._take_in)
        self._published_at = float("-inf")
        self._published: dict[tuple[str, str], set[tuple[str, str]]] = {}

    def record(
        self,
        runtime: ModelRuntime,
        status: int,
        seconds: float,
        prediction: Prediction | None,
    ) -> None:
        """One request answered (or failed) by ``runtime``'s version, at ``clock()``."""
        now = self.clock()
        texts = 0 if prediction is None else len(prediction.batch.lengths)
        self._backlog.add((runtime, status, seconds, prediction, now), texts)
        if now - self._published_at >= self.publish_interval_s:
            self._published_at = now
            self.publish()

    @property
    def counters(self) -> dict[str, VersionCounters]:
        """Each version's counters (``"model/version"``), every request so far counted."""
        self._backlog.take_in()
        return self._counters

    @property
    def windows(self) -> dict[tuple[str, str], DriftWindow]:
        """Each version's drift window, every request so far added."""
        self._backlog.take_in()
        return self._windows

    def _take_in(self, pending: list[Pending]) -> None:
        """The waiting requests into their versions' counters and drift windows."""
        by_version: dict[tuple[str, str], list[Pending]] = {}
        for entry in pending:
            served = entry[0].served
            by_version.setdefault((served.name, served.version), []).append(entry)
        for key, entries in by_version.items():
            self._add_version(key, entries)

    def _add_version(self, key: tuple[str, str], entries: list[Pending]) -> None:
        runtime = entries[0][0]
        task = tasks.get(runtime.spec.task)
        figures: list[Figures | None] = []
        shares: list[tuple[np.ndarray | None, tuple[str, ...]]] = []
        for _, _, _, prediction, _ in entries:
            if prediction is None:
                figures.append(None)
                shares.append((None, ()))
                continue
            figure = prediction.figures or task.figures(
                prediction.raw, prediction.batch, prediction.labels
            )
            figures.append(figure)
            shares.append(
                task.counter_shares(figure, prediction.raw, prediction.batch, prediction.labels)
            )
        statuses = [status for _, status, _, _, _ in entries]
        seconds = [elapsed for _, _, elapsed, _, _ in entries]
        self.version_counters(runtime).count_many(statuses, seconds, shares)
        answered = [
            (entry, figure)
            for entry, figure in zip(entries, figures, strict=True)
            if figure is not None and entry[0].reference
        ]
        if answered:
            self._add_to_window(key, answered)

    def _add_to_window(self, key: tuple[str, str], answered: list[tuple[Pending, Figures]]) -> None:
        runtime = answered[0][0][0]
        window = self._windows.get(key)
        if window is None:
            window = DriftWindow(runtime.reference, runtime.spec.task, clock=self.clock)
            self._windows[key] = window
        # One add per run of requests whose outputs stack (a token classifier's rows are
        # as long as each request's longest text: those go one by one).
        run: list[tuple[Prediction, float, Figures]] = []
        for (_, _, _, prediction, at), figure in answered:
            assert prediction is not None
            if run and run[-1][0].raw.shape[1:] != prediction.raw.shape[1:]:
                self._add_run(key, window, run)
                run = []
            run.append((prediction, at, figure))
        self._add_run(key, window, run)

    @staticmethod
    def _add_run(
        key: tuple[str, str], window: DriftWindow, run: list[tuple[Prediction, float, Figures]]
    ) -> None:
        batches = [prediction.batch for prediction, _, _ in run]
        raws = [prediction.raw for prediction, _, _ in run]
        times = np.repeat([at for _, at, _ in run], [len(batch.lengths) for batch in batches])
        try:
            window.add(
                np.concatenate([batch.lengths for batch in batches]),
                np.concatenate([batch.unknown_ratio for batch in batches]),
                np.concatenate(raws) if len(raws) > 1 else raws[0],
                figures=Figures.concat([figure for _, _, figure in run]),
                at=times,
            )
        except ValueError:  # outputs that do not fit the reference: no drift for them
            log.exception("drift statistics of %s v%s failed", *key)

    def version_counters(self, runtime: ModelRuntime) -> VersionCounters:
        """The counters of ``runtime``'s version, which the control plane reads."""
        key = f"{runtime.served.name}/{runtime.served.version}"
        counters = self._counters.get(key)
        if counters is None:
            counters = self._counters[key] = VersionCounters()
        return counters

    def publish(self) -> None:
        self._backlog.take_in()
        for key, counters in self._counters.items():
            shadow = counters.shadow
            if shadow.requests or shadow.dropped:  # a canary in shadow, now or before
                model, version = key.rsplit("/", 1)
                self.telemetry.shadow(model, version, shadow)
        for (model, version), window in self._windows.items():
            scores = window.scores()
            published = self._published.setdefault((model, version), set())
            # A drained window has no scores: publish NaN (no data) rather than leave the
            # last values standing, which would keep a drift alert firing on old traffic.
            stale = {key: float("nan") for key in published - set(scores)}
            if scores or stale:
                self.telemetry.drift(model, version, {**scores, **stale})
            published |= set(scores)
