"""Recording the metrics of ``infergate.observe.metrics`` from a front-end replica.

``Telemetry`` is what the front-end calls; ``RayTelemetry`` records through Ray's metrics
API (exported by each node's Ray metrics agent), ``NullTelemetry`` records nothing.

A replica adds every observation to in-process totals (``Totals``) and its owner hands
Ray the totals about once a second (``flush``), as gauges named like Prometheus counters
and histogram series (``_bucket{le=...}``, ``_sum``, ``_count``; each bucket under a
name of its own in Ray, see ``bucket_gauges``). A request only joins a
backlog (``RayTelemetry.request``, ``infergate.observe.backlog``); the totals take it in
at the next read (a flush), or once it is full, a histogram's values in one numpy pass instead
of a Python call per value: about a quarter of the replica's own request path, measured
side by side (``infergate.bench.request_cpu``), was the totals and the statistics taken
per request. Totals read are the same as added per request: every value counted, and
each sum added up in the same order. Recording each observation through
Ray's counters and histograms cost about a quarter of the platform's throughput at a
few hundred requests a second: a dozen calls into Ray per request in the replica, and
Ray's metrics agent replays every histogram observation (at its bucket's midpoint, so
Ray's ``_sum`` is approximate; ours is exact).

Upgrading from a version that recorded through Ray's counters needs a fresh Ray cluster:
a node's metrics agent keeps the kind a name was first registered with, and would add
our totals to the old counters.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from infergate import tasks
from infergate.observe import metrics as m
from infergate.observe.backlog import Backlog
from infergate.observe.counters import ShadowCounters
from infergate.serving.runtime import Prediction
from infergate.tasks import Figures


class Telemetry(Protocol):
    def request(
        self, model: str, version: str, status: int, prediction: Prediction | None, total_s: float
    ) -> None: ...

    def caller(self, key: str, model: str, status: int) -> None: ...

    def drift(self, model: str, version: str, scores: dict[tuple[str, str], float]) -> None: ...

    def weight(self, model: str, version: str, role: str, weight: float) -> None: ...

    def flush(self) -> None: ...

    def shadow(self, model: str, version: str, counters: ShadowCounters) -> None: ...

    def payloads(self, outcomes: dict[str, int]) -> None: ...


class NullTelemetry:
    def request(self, *args: Any) -> None:
        pass

    def caller(self, *args: Any) -> None:
        pass

    def drift(self, *args: Any) -> None:
        pass

    def weight(self, *args: Any) -> None:
        pass

    def shadow(self, *args: Any) -> None:
        pass

    def payloads(self, *args: Any) -> None:
        pass

    def flush(self) -> None:
        pass


Labels = tuple[str, ...]
# A request waiting to be added up: model, version, status, its prediction, its seconds.
Pending = tuple[str, str, int, Prediction | None, float]


class Totals:
    """Counter and histogram totals of one process, read out as Prometheus samples.

    Cumulative from the process's start, as Prometheus counters are. A replica that
    restarts is a new Ray worker, so its totals are new series (another ``WorkerId``).
    """

    def __init__(self) -> None:
        self._counters: dict[tuple[str, Labels], float] = {}
        self._histograms: dict[tuple[str, Labels], _Histogram] = {}
        self._metrics: dict[str, m.Metric] = {}

    def inc(self, metric: m.Metric, labels: Labels, value: float = 1.0) -> None:
        key = (metric.name, labels)
        total = self._counters.get(key)
        if total is None:
            self._metrics[metric.name] = metric
            total = 0.0
        self._counters[key] = total + value

    def observe(self, metric: m.Metric, labels: Labels, values: Iterable[float]) -> None:
        histogram = self._histogram(metric, labels)
        for value in values:
            histogram.add(value)

    def observe_many(self, metric: m.Metric, labels: Labels, values: np.ndarray) -> None:
        """``observe`` for an array of values, in one pass."""
        self._histogram(metric, labels).add_many(values)

    def _histogram(self, metric: m.Metric, labels: Labels) -> _Histogram:
        histogram = self._histograms.get((metric.name, labels))
        if histogram is None:
            self._metrics[metric.name] = metric
            histogram = self._histograms[(metric.name, labels)] = _Histogram(metric.buckets)
        return histogram

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """``(series name, labels, value)`` for every counter and histogram series."""
        for (name, labels), value in self._counters.items():
            metric = self._metrics[name]
            yield metric.full_name, dict(zip(metric.labels, labels, strict=True)), value
        for (name, labels), histogram in self._histograms.items():
            metric = self._metrics[name]
            tags = dict(zip(metric.labels, labels, strict=True))
            for le, count in histogram.cumulative():
                yield f"{metric.full_name}_bucket", {**tags, "le": le}, count
            yield f"{metric.full_name}_sum", tags, histogram.sum
            yield f"{metric.full_name}_count", tags, histogram.count


class _Histogram:
    __slots__ = ("bounds", "bounds_array", "count", "counts", "les", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.bounds_array = np.asarray(bounds, dtype=np.float64)
        self.les = bucket_labels(bounds)
        self.counts = [0] * (len(bounds) + 1)  # the last one counts values above every bound
        self.sum = 0.0
        self.count = 0

    def add(self, value: float) -> None:
        if not math.isfinite(value):  # a NaN would make the sum NaN for good
            return
        self.counts[bisect_left(self.bounds, value)] += 1  # bucket le=b holds value <= b
        self.sum += value
        self.count += 1

    def add_many(self, values: np.ndarray) -> None:
        """``add`` of every value, the buckets by one ``searchsorted`` (``side="left"``
        is ``bisect_left``); the sum still added value by value, in order, so that it is
        the very float ``add`` makes (numpy's ``sum`` pairs values up: other roundings)."""
        array = np.asarray(values, dtype=np.float64).ravel()
        finite = array[np.isfinite(array)]
        if not finite.size:
            return
        slots = np.searchsorted(self.bounds_array, finite, side="left")
        added = np.bincount(slots, minlength=len(self.counts)).tolist()
        self.counts = [a + b for a, b in zip(self.counts, added, strict=True)]
        total = self.sum
        for value in finite.tolist():
            total += value
        self.sum = total
        self.count += int(finite.size)

    def cumulative(self) -> Iterator[tuple[str, int]]:
        """``(le, observations <= le)`` per bucket."""
        running = 0
        for le, count in zip(self.les, self.counts, strict=True):
            running += count
            yield le, running


def _category_counts(figures: list[Figures]) -> Iterator[tuple[tuple[str, ...], list[float]]]:
    """Texts per category over ``figures`` (all with categories), per set of names."""
    by_names: dict[tuple[str, ...], list[np.ndarray]] = {}
    for figure in figures:
        assert figure.categories is not None
        by_names.setdefault(figure.names, []).append(figure.categories)
    for names, parts in by_names.items():
        yield names, np.concatenate(parts).sum(axis=0).tolist()


def bucket_labels(bounds: tuple[float, ...]) -> list[str]:
    """The ``le`` label of each bucket: ``0.005``, ``1.0``, ..., ``+Inf``."""
    return [repr(float(bound)) for bound in bounds] + ["+Inf"]


def bucket_gauges(metric: m.Metric) -> list[tuple[str, str]]:
    """``(le, gauge name)`` of each bucket of histogram ``metric``.

    Ray gets each bucket as a metric of its own (``..._bucket_00``, ``_01``, ...), which
    the scrape of Ray's agent names ``..._bucket`` again, ``le`` as it was
    (``deployments/prometheus.yml``). Ray's metrics agent keeps at most 2,000 label sets
    per metric for its whole life and folds later ones into one overflow series. With
    ``le`` among the labels, the 22 buckets of the four stages' latency took 88 of them per
    (version, replica process): 22 such pairs filled it. With a metric per bucket, a
    histogram has the room of a counter with the same labels: 2,000 pairs, or 500 for the
    latency's four stages (``docs/monitoring.md#limits``)."""
    labels = bucket_labels(metric.buckets)
    return [(le, f"{metric.full_name}_bucket_{i:02d}") for i, le in enumerate(labels)]


def series_definitions() -> Iterator[tuple[str, str, Labels]]:
    """``(gauge name, description, label names)`` of every gauge a replica sets."""
    for metric in m.FRONTEND:
        if metric.kind == "histogram":
            for _, name in bucket_gauges(metric):
                yield name, metric.description, (*metric.labels, "le")
            yield f"{metric.full_name}_sum", metric.description, metric.labels
            yield f"{metric.full_name}_count", metric.description, metric.labels
        else:
            yield metric.full_name, metric.description, metric.labels


class RayTelemetry:
    """Totals kept in the replica, handed to Ray as gauges by ``flush``, which the replica
    calls about once a second (Ray drops a gauge not set again within two of its export
    intervals, so an idle replica's totals are set again too)."""

    def __init__(self) -> None:
        from ray.util import metrics as ray_metrics

        self._totals = Totals()
        self._backlog: Backlog[Pending] = Backlog(self._take_in)
        self._gauges = {
            name: ray_metrics.Gauge(name, description=description, tag_keys=labels)
            for name, description, labels in series_definitions()
        }
        # A bucket series (name and le) -> the name of the gauge Ray gets for it.
        self._bucket_gauges = {
            (f"{metric.full_name}_bucket", le): name
            for metric in m.FRONTEND
            if metric.kind == "histogram"
            for le, name in bucket_gauges(metric)
        }

    @property
    def totals(self) -> Totals:
        """Every request's figures so far, the ones waiting included."""
        self._backlog.take_in()
        return self._totals

    def request(
        self, model: str, version: str, status: int, prediction: Prediction | None, total_s: float
    ) -> None:
        texts = 0 if prediction is None else len(prediction.batch.lengths)
        self._backlog.add((model, version, status, prediction, total_s), texts)

    def _take_in(self, pending: list[Pending]) -> None:
        """The waiting requests into the totals: statuses counted, and the answered
        ones' figures per version and task, each histogram's values in one pass."""
        totals = self._totals
        answered: dict[tuple[str, str, tasks.Task], list[tuple[Prediction, float]]] = {}
        for model, version, status, prediction, total_s in pending:
            totals.inc(m.REQUESTS, (model, version, str(status)))
            if prediction is not None:
                key = (model, version, tasks.of(prediction))
                answered.setdefault(key, []).append((prediction, total_s))
        for (model, version, task), predictions in answered.items():
            self._answered((model, version), task, predictions)

    def _answered(
        self, mv: Labels, task: tasks.Task, predictions: list[tuple[Prediction, float]]
    ) -> None:
        totals = self._totals
        totals.observe_many(m.DURATION, (*mv, m.TOTAL.name), np.array([s for _, s in predictions]))
        stages: dict[str, list[float]] = {}
        for prediction, _ in predictions:
            for stage, seconds in prediction.timings.stages():
                stages.setdefault(stage.name, []).append(seconds)
        for stage_name, seconds_list in stages.items():
            totals.observe_many(m.DURATION, (*mv, stage_name), np.array(seconds_list))
        batches = [prediction.batch for prediction, _ in predictions]
        texts = [len(batch.lengths) for batch in batches]
        totals.inc(m.TEXTS, mv, sum(texts))
        totals.observe_many(m.TEXTS_PER_REQUEST, mv, np.array(texts))
        totals.observe_many(m.INPUT_TOKENS, mv, np.concatenate([b.lengths for b in batches]))
        unknown = np.concatenate([b.unknown_ratio for b in batches])
        totals.observe_many(m.UNKNOWN_TOKEN_RATIO, mv, unknown)
        truncated = int(np.concatenate([b.truncated for b in batches]).sum())
        if truncated:
            totals.inc(m.TRUNCATED, mv, truncated)
        figures = [
            prediction.figures or task.figures(prediction.raw, prediction.batch, prediction.labels)
            for prediction, _ in predictions
        ]
        totals.observe_many(task.value_metric, mv, np.concatenate([f.values for f in figures]))
        if task.time_per_token_metric is not None:
            for (prediction, _), figure in zip(predictions, figures, strict=True):
                generated = float(figure.values.sum())
                if generated > 0:
                    per_token = prediction.timings.inference_s / generated
                    totals.observe(task.time_per_token_metric, mv, (per_token,))
        if task.category_metric is not None:
            counted = [f for f in figures if f.categories is not None]
            for names, counts in _category_counts(counted):
                for name, count in zip(names, counts, strict=True):
                    if count:
                        totals.inc(task.category_metric, (*mv, name), count)

    def caller(self, key: str, model: str, status: int) -> None:
        self._totals.inc(m.KEY_REQUESTS, (key, model, str(status)))

    def gauge_of(self, series: str, tags: Mapping[str, str]) -> str:
        """The Ray gauge that carries ``series`` with ``tags``: a bucket's own for a bucket."""
        le = tags.get("le")
        return series if le is None else self._bucket_gauges[series, le]

    def flush(self) -> None:
        for name, tags, value in self.totals.samples():
            self._gauges[self.gauge_of(name, tags)].set(value, tags)

    def shadow(self, model: str, version: str, counters: ShadowCounters) -> None:
        """A canary in shadow's counters, as they stand (cumulative, like the totals)."""
        mv = {"model": model, "version": version}
        self._gauges[m.SHADOW_TEXTS.full_name].set(counters.texts, mv)
        self._gauges[m.SHADOW_DISAGREEMENT.full_name].set(counters.disagreement, mv)
        outcomes = {
            "compared": counters.requests - counters.errors,
            "failed": counters.errors,
            "slower": counters.slower,
            "dropped": counters.dropped,
        }
        for outcome, value in outcomes.items():
            self._gauges[m.SHADOW_REQUESTS.full_name].set(value, {**mv, "outcome": outcome})

    def payloads(self, outcomes: dict[str, int]) -> None:
        """The payload log's record counts, by outcome, as they stand (cumulative)."""
        gauge = self._gauges[m.PAYLOAD_RECORDS.full_name]
        for outcome, value in outcomes.items():
            gauge.set(value, {"outcome": outcome})

    def drift(self, model: str, version: str, scores: dict[tuple[str, str], float]) -> None:
        gauge = self._gauges[m.DRIFT.full_name]
        for (feature, method), value in scores.items():
            tags = {"model": model, "version": version, "feature": feature, "method": method}
            gauge.set(value, tags)

    def weight(self, model: str, version: str, role: str, weight: float) -> None:
        tags = {"model": model, "version": version, "role": role}
        self._gauges[m.ROLLOUT_WEIGHT.full_name].set(weight, tags)
