"""Per-version request counters that front-end replicas keep and the control plane reads
for canary analysis, without Prometheus. Cumulative, so windows are differences: a
``VersionWindow`` is what one version saw over a rollout step."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from infergate.observe.metrics import LATENCY_BUCKETS_S, NORM_BUCKETS


@dataclass
class ShadowCounters:
    """What a canary in its shadow stage did with the champion's mirrored requests: its
    answers compared, text by text, with the champion's to the same texts."""

    requests: int = 0  # mirrored requests the canary answered or failed
    errors: int = 0  # ... failed (5xx): each of their texts counts as a disagreement
    texts: int = 0  # texts compared (or failed)
    disagreement: float = 0.0  # summed over texts, each 0 (agrees) to 1
    slower: int = 0  # requests it answered slower than the champion (``versions.Shadow``)
    dropped: int = 0  # mirrors not sent: the replica had too many under way
    largest_change: float = 0.0  # the task's figure (``tasks.Paired.change``), the largest

    @property
    def agreement(self) -> float:
        return 1.0 - self.disagreement / self.texts if self.texts else 1.0

    def combined(self, other: ShadowCounters, sign: int) -> ShadowCounters:
        """Sum (``sign`` 1) or difference (-1); the largest change is a maximum either way
        (a version's counters start with it, so a difference keeps the whole run's)."""
        return ShadowCounters(
            self.requests + sign * other.requests,
            self.errors + sign * other.errors,
            self.texts + sign * other.texts,
            self.disagreement + sign * other.disagreement,
            self.slower + sign * other.slower,
            self.dropped + sign * other.dropped,
            max(self.largest_change, other.largest_change),
        )

    def to_dict(self) -> dict[str, float]:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, data: dict | None) -> ShadowCounters:
        return cls(**data) if data else cls()


@dataclass(frozen=True)
class VersionWindow:
    """What the front-end saw of one version since the current step began."""

    requests: int = 0
    errors: int = 0  # server-side failures (5xx) after the version was chosen
    p95_ms: float = 0.0
    output_shares: tuple[float, ...] = ()  # predicted classes, or binned embedding norms
    latency_counts: tuple[int, ...] = ()  # requests per latency bucket (metrics' buckets)
    classes: tuple[str, ...] = ()  # the classes of ``output_shares``; none for embeddings
    shadow: ShadowCounters = field(default_factory=ShadowCounters)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass
class VersionCounters:
    requests: int = 0
    errors: int = 0  # 5xx after the version was chosen
    latency: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    # Class shares, or embedding-norm bin shares, summed over requests: each request adds
    # 1 in all, however many texts it holds, so that one client's batch of 64 weighs as
    # one request in the canary comparison, not as 64.
    outputs: list[float] = field(default_factory=list)
    classes: tuple[str, ...] = ()  # what ``outputs`` counts, for a classifier
    shadow: ShadowCounters = field(default_factory=ShadowCounters)

    def add(self, status: int, seconds: float, raw: np.ndarray | None, labels: list[str]) -> None:
        """One request: class shares of ``raw`` probabilities when ``labels`` name its
        columns, else binned vector norms (the two original tasks; ``count`` is general)."""
        if raw is None or raw.ndim != 2:
            self.count(status, seconds, None)
            return
        if labels:
            counts = np.bincount(raw.argmax(axis=-1), minlength=len(labels))
        else:
            bins = np.searchsorted(NORM_BUCKETS, np.linalg.norm(raw, axis=-1))
            counts = np.bincount(bins, minlength=len(NORM_BUCKETS) + 1)
        self.count(status, seconds, counts / max(len(raw), 1), tuple(labels))

    def count(
        self,
        status: int,
        seconds: float,
        shares: np.ndarray | None,
        classes: tuple[str, ...] = (),
    ) -> None:
        """One request: its status, latency and output ``shares`` (summing to 1, or empty
        or None when it has none), of ``classes`` if they are named."""
        self.requests += 1
        if status >= 500:
            self.errors += 1
        self.latency[int(np.searchsorted(LATENCY_BUCKETS_S, seconds))] += 1
        if shares is None or not len(shares):
            return
        self._add_shares(shares, classes)

    def _add_shares(self, shares: np.ndarray, classes: tuple[str, ...]) -> None:
        if classes:
            self.classes = tuple(classes)
        if not self.outputs:
            self.outputs = [0.0] * len(shares)
        if len(shares) != len(self.outputs):  # another head under the same key: start over
            self.outputs = [0.0] * len(shares)
        self.outputs = [a + float(b) for a, b in zip(self.outputs, shares, strict=True)]

    def count_many(
        self,
        statuses: list[int],
        seconds: list[float],
        shares: list[tuple[np.ndarray | None, tuple[str, ...]]],
    ) -> None:
        """``count`` of several requests, in order: their latencies binned at once."""
        self.requests += len(statuses)
        self.errors += sum(1 for status in statuses if status >= 500)
        slots = np.searchsorted(LATENCY_BUCKETS_S, np.asarray(seconds, dtype=np.float64))
        added = np.bincount(slots, minlength=len(self.latency)).tolist()
        self.latency = [a + b for a, b in zip(self.latency, added, strict=True)]
        for request_shares, classes in shares:
            if request_shares is not None and len(request_shares):
                self._add_shares(request_shares, classes)

    def merged(self, other: VersionCounters) -> VersionCounters:
        return self._combine(other, 1)

    def minus(self, other: VersionCounters) -> VersionCounters:
        return self._combine(other, -1)

    def _combine(self, other: VersionCounters, sign: int) -> VersionCounters:
        outputs = self.outputs or [0] * len(other.outputs)
        theirs = other.outputs or [0] * len(outputs)
        return VersionCounters(
            self.requests + sign * other.requests,
            self.errors + sign * other.errors,
            [a + sign * b for a, b in zip(self.latency, other.latency, strict=True)],
            [a + sign * b for a, b in zip(outputs, theirs, strict=True)],
            self.classes or other.classes,
            self.shadow.combined(other.shadow, sign),
        )

    def p95_ms(self) -> float:
        """The 95th percentile, interpolated linearly inside its bucket as Prometheus's
        ``histogram_quantile`` does. A bucket's upper edge instead would move a p95 by a
        whole bucket (7.5 -> 10 -> 15 ms) for one request more or less."""
        total = sum(self.latency)
        if not total:
            return 0.0
        rank = 0.95 * total
        cumulative = np.cumsum(self.latency)
        index = min(int(np.searchsorted(cumulative, rank)), len(self.latency) - 1)
        edges = (0.0, *LATENCY_BUCKETS_S, LATENCY_BUCKETS_S[-1] * 2)
        lower, upper = edges[index], edges[index + 1]
        below = cumulative[index - 1] if index else 0
        inside = self.latency[index]
        share = (rank - below) / inside if inside else 1.0
        return float(lower + (upper - lower) * share) * 1e3

    def window(self) -> VersionWindow:
        total = sum(self.outputs)
        shares = tuple(c / total for c in self.outputs) if total else ()
        return VersionWindow(
            self.requests, self.errors, self.p95_ms(), shares, tuple(self.latency), self.classes,
            self.shadow,
        )  # fmt: skip

    def to_dict(self) -> dict:
        return {"requests": self.requests, "errors": self.errors, "latency": self.latency,
                "outputs": self.outputs, "classes": list(self.classes),
                "shadow": self.shadow.to_dict()}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> VersionCounters:
        return cls(
            data["requests"], data["errors"], list(data["latency"]), list(data["outputs"]),
            tuple(data.get("classes", ())), ShadowCounters.from_dict(data.get("shadow")),
        )  # fmt: skip


def merge_reports(reports: list[dict[str, dict]]) -> dict[str, VersionCounters]:
    """Sum the per-replica reports, keyed ``"model/version"``."""
    merged: dict[str, VersionCounters] = {}
    for report in reports:
        for key, data in report.items():
            counters = VersionCounters.from_dict(data)
            merged[key] = merged[key].merged(counters) if key in merged else counters
    return merged
