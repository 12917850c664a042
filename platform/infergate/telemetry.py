"""Recording the metrics of ``infergate.metrics`` from a front-end replica.

``Telemetry`` is what the front-end calls; ``RayTelemetry`` records through Ray's metrics
API (exported by each node's Ray metrics agent), ``NullTelemetry`` records nothing.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from infergate import metrics as m
from infergate.runtime import Prediction


class Telemetry(Protocol):
    def request(
        self, model: str, version: str, status: int, prediction: Prediction | None, total_s: float
    ) -> None: ...

    def drift(self, model: str, version: str, scores: dict[tuple[str, str], float]) -> None: ...

    def weight(self, model: str, version: str, role: str, weight: float) -> None: ...


class NullTelemetry:
    def request(self, *args: Any) -> None:
        pass

    def drift(self, *args: Any) -> None:
        pass

    def weight(self, *args: Any) -> None:
        pass


class RayTelemetry:
    """One Ray metric object per definition, created once per replica."""

    def __init__(self) -> None:
        from ray.util import metrics as ray_metrics

        def make(metric: m.Metric) -> Any:
            common = {"description": metric.description, "tag_keys": metric.labels}
            if metric.kind == "counter":
                return ray_metrics.Counter(metric.full_name, **common)
            if metric.kind == "gauge":
                return ray_metrics.Gauge(metric.full_name, **common)
            return ray_metrics.Histogram(
                metric.full_name, boundaries=list(metric.buckets), **common
            )

        self._metrics = {metric.name: make(metric) for metric in m.ALL}

    def request(
        self, model: str, version: str, status: int, prediction: Prediction | None, total_s: float
    ) -> None:
        tags = {"model": model, "version": version}
        self._metrics[m.REQUESTS.name].inc(1, {**tags, "status": str(status)})
        if prediction is None:
            return
        duration = self._metrics[m.DURATION.name]
        timings = prediction.timings
        duration.observe(total_s, {**tags, "stage": "total"})
        duration.observe(timings.tokenize / 1e3, {**tags, "stage": "tokenize"})
        duration.observe(timings.inference / 1e3, {**tags, "stage": "inference"})
        duration.observe(timings.postprocess / 1e3, {**tags, "stage": "postprocess"})
        batch = prediction.batch
        texts = len(batch.lengths)
        self._metrics[m.TEXTS.name].inc(texts, tags)
        self._metrics[m.TEXTS_PER_REQUEST.name].observe(texts, tags)
        self._observe_each(m.INPUT_TOKENS, batch.lengths, tags)
        self._observe_each(m.UNKNOWN_TOKEN_RATIO, batch.unknown_ratio, tags)
        truncated = int(batch.truncated.sum())
        if truncated:
            self._metrics[m.TRUNCATED.name].inc(truncated, tags)
        raw = prediction.raw
        if raw.ndim == 2 and prediction.labels:
            predicted = np.bincount(raw.argmax(axis=-1), minlength=len(prediction.labels))
            counter = self._metrics[m.PREDICTED_CLASS.name]
            for label, count in zip(prediction.labels, predicted.tolist(), strict=True):
                if count:
                    counter.inc(count, {**tags, "class": label})
            self._observe_each(m.CONFIDENCE, raw.max(axis=-1), tags)
        else:
            self._observe_each(m.EMBEDDING_NORM, np.linalg.norm(raw, axis=-1), tags)

    def _observe_each(self, metric: m.Metric, values: np.ndarray, tags: dict[str, str]) -> None:
        histogram = self._metrics[metric.name]
        for value in values.tolist():
            histogram.observe(value, tags)

    def drift(self, model: str, version: str, scores: dict[tuple[str, str], float]) -> None:
        gauge = self._metrics[m.DRIFT.name]
        for (feature, method), value in scores.items():
            tags = {"model": model, "version": version, "feature": feature, "method": method}
            gauge.set(value, tags)

    def weight(self, model: str, version: str, role: str, weight: float) -> None:
        tags = {"model": model, "version": version, "role": role}
        self._metrics[m.ROLLOUT_WEIGHT.name].set(weight, tags)
