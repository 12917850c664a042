"""Drift of live traffic against the reference statistics taken at registration.

Pure numpy. A front-end replica keeps one :class:`DriftWindow` per served version, feeds
it after every request and publishes :meth:`DriftWindow.scores` as the
``infergate_drift_score{feature, method}`` gauges about once a second.

Scores, keyed ``(feature, method)``:

- ``("token_length", "psi")``: tokens per text, binned with the reference edges.
- ``("unknown_token_ratio", "ratio_delta")``: live mean minus reference mean.
- text-classification: ``("predicted_class", "psi")`` over the classes and
  ``("confidence", "psi")`` over the probability of the predicted class.
- feature-extraction: ``("embedding_norm", "psi")`` over the raw embedding norm (decile
  edges of the reference) and ``("centroid", "cosine_distance")`` between the mean unit
  vectors, live and reference.
- the other tasks (``infergate.tasks``): ``(value_key, "psi")`` over their per-text
  value (decile edges of the reference) and, where they count categories,
  ``(category_feature, "psi")`` over those.

Rule of thumb for PSI (the thresholds of ``deployments/alerts.yml``): below 0.1 no
significant shift, 0.1 to 0.25 a moderate one, above 0.25 a major one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from infergate import tasks
from infergate.tasks import Figures

DEFAULT_EPS = 1e-4


def psi(expected_shares: ArrayLike, actual_shares: ArrayLike, eps: float = DEFAULT_EPS) -> float:
    """Population stability index ``sum((a - e) * ln(a / e))`` over the bins.

    Both inputs are normalised to sum to 1 first (counts are fine too). Smoothing: every
    share is then floored at ``eps`` (no renormalisation afterwards), so a bin empty on one
    side adds a large but finite term ``(a - eps) * ln(a / eps)`` instead of infinity. With
    ``eps = 1e-4`` a bin holding 1 % of the live texts and none of the reference adds
    about 0.046.
    """
    expected = np.asarray(expected_shares, dtype=np.float64)
    actual = np.asarray(actual_shares, dtype=np.float64)
    if expected.shape != actual.shape or expected.ndim != 1:
        raise ValueError(
            f"PSI needs two 1-d share vectors of the same length; got shapes "
            f"{expected.shape} and {actual.shape}"
        )
    if expected.sum() <= 0 or actual.sum() <= 0:
        raise ValueError("PSI needs at least one observation on each side")
    expected = np.maximum(expected / expected.sum(), eps)
    actual = np.maximum(actual / actual.sum(), eps)
    return float(np.sum((actual - expected) * np.log(actual / expected)))


def _edges(values: Sequence[Any]) -> np.ndarray:
    """Bin edges from the reference JSON. ``json`` round-trips the open ends as
    ``-Infinity``/``Infinity``; encoders that cannot (orjson) write ``null`` instead."""
    edges = [float(v) if v is not None else np.nan for v in values]
    if np.isnan(edges[0]):
        edges[0] = -np.inf
    if np.isnan(edges[-1]):
        edges[-1] = np.inf
    return np.asarray(edges, dtype=np.float64)


def _histogram(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts per ``np.histogram`` bin of ``edges``. Values outside the reference range
    count in the first or last bin rather than being dropped: they are drift, not noise."""
    index = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, len(edges) - 2)
    return np.bincount(index, minlength=len(edges) - 1)


class DriftWindow:
    """The last texts served by one model version, compared with its reference.

    A ring buffer of per-text records (token count, unknown-token ratio, the task's value
    and category counts, the unit embedding), so :meth:`add`, which runs on every
    request, only copies a few numbers per text (and normalises an embedding), and memory
    stays bounded. A text leaves the window when ``max_texts`` newer ones arrived or when
    it is older than ``max_age_s`` by ``clock``. :meth:`scores` bins and compares the live
    records, O(max_texts), cheap enough to call every second. With fewer than
    ``min_texts`` texts in the window it returns no scores at all: PSI over a handful of
    texts is noise that would page people.
    """

    def __init__(
        self,
        reference: Mapping[str, Any],
        task: str,
        *,
        max_texts: int = 2000,
        max_age_s: float = 600,
        min_texts: int = 50,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if task not in tasks.TASKS:
            raise ValueError(f"no drift statistics for task {task!r}")
        if max_texts < 1 or min_texts < 1:
            raise ValueError("max_texts and min_texts must be at least 1")
        self.task = tasks.get(task)
        self.max_texts = max_texts
        self.max_age_s = max_age_s
        self.min_texts = min_texts
        self.clock = clock

        self._length_edges = _edges(reference["token_length"]["edges"])
        self._length_ref = np.asarray(reference["token_length"]["counts"], dtype=np.float64)
        self._unknown_ref = float(reference["unknown_token_ratio_mean"])
        value = reference[self.task.value_key]
        self._value_edges = _edges(value["edges"])
        self._value_ref = np.asarray(value["counts"], dtype=np.float64)
        self._category_ref: np.ndarray | None = None
        if self.task.category_key:
            shares = list(reference[self.task.category_key].values())
            self._category_ref = np.asarray(shares, dtype=np.float64)
        self._centroid_ref = (
            np.asarray(reference["centroid"], dtype=np.float64) if self.task.centroid else None
        )

        # Ring buffer: slot (self._start + k) % max_texts holds the k-th oldest text. Texts
        # past max_age_s leave it lazily, when the window is read.
        self._start = 0
        self._size = 0
        self._time = np.zeros(max_texts, dtype=np.float64)
        self._length = np.zeros(max_texts, dtype=np.float64)
        self._unknown = np.zeros(max_texts, dtype=np.float64)
        self._value = np.zeros(max_texts, dtype=np.float64)  # the task's per-text value
        self._categories: np.ndarray | None = None
        if self._category_ref is not None:
            self._categories = np.zeros((max_texts, len(self._category_ref)), np.float32)
        self._unit: np.ndarray | None = None  # [max_texts, dim], allocated on first add

    @property
    def count(self) -> int:
        """Texts in the window now (after expiring those older than ``max_age_s``)."""
        self._expire(self.clock())
        return self._size

    def add(
        self,
        lengths: np.ndarray,
        unknown_ratio: np.ndarray,
        outputs: np.ndarray,
        *,
        figures: Figures | None = None,
        at: np.ndarray | None = None,
    ) -> None:
        """Record one request's texts: token counts, unknown-token ratios and the model
        outputs (``Prediction.raw``: class probabilities, raw embeddings...), one row per
        text; ``figures`` when already taken from them (else taken here). ``at``: each
        text's time by ``clock`` (several requests added at once), non-decreasing and
        not before the texts already in the window; else now."""
        outputs = np.asarray(outputs)
        n = len(lengths)
        if n == 0:
            return
        if len(unknown_ratio) != n or outputs.ndim < 2 or outputs.shape[0] != n:
            raise ValueError(
                f"one row per text expected: {n} lengths, {len(unknown_ratio)} ratios, "
                f"outputs of shape {outputs.shape}"
            )
        if at is not None and len(at) != n:
            raise ValueError(f"one time per text expected: {n} texts, {len(at)} times")
        if figures is None:
            figures = self.task.figures(outputs, None, ())
        categories = figures.categories
        if self._category_ref is not None and (
            categories is None or categories.shape[1] != len(self._category_ref)
        ):
            got = None if categories is None else categories.shape[1]
            raise ValueError(
                f"the reference has {len(self._category_ref)} classes, the outputs "
                f"{got}: is this the reference of another model?"
            )
        values = figures.values
        if n > self.max_texts:  # only the newest max_texts of a huge batch can stay
            keep = slice(n - self.max_texts, n)
            lengths, unknown_ratio, outputs = lengths[keep], unknown_ratio[keep], outputs[keep]
            values = values[keep]
            at = at[keep] if at is not None else None
            categories = categories[keep] if categories is not None else None
            n = self.max_texts
        first = (self._start + self._size) % self.max_texts
        # A slice while the batch fits before the ring's end (nearly always): no index array.
        slots: slice | np.ndarray = (
            slice(first, first + n)
            if first + n <= self.max_texts
            else (first + np.arange(n)) % self.max_texts
        )
        self._time[slots] = self.clock() if at is None else at
        self._length[slots] = lengths
        self._unknown[slots] = unknown_ratio
        self._value[slots] = values
        if self._categories is not None and categories is not None:
            self._categories[slots] = categories
        if self._centroid_ref is not None:
            if self._unit is None:
                self._unit = np.zeros((self.max_texts, outputs.shape[1]), dtype=np.float32)
            norms = np.maximum(values[:, None], 1e-12)  # the value is the embedding norm
            self._unit[slots] = outputs / norms
        overflow = max(0, self._size + n - self.max_texts)  # overwritten: the oldest
        self._start = (self._start + overflow) % self.max_texts
        self._size = min(self.max_texts, self._size + n)

    def scores(self) -> dict[tuple[str, str], float]:
        """Drift scores keyed ``(feature, method)``; empty below ``min_texts`` texts."""
        self._expire(self.clock())
        if self._size < self.min_texts:
            return {}
        live = (self._start + np.arange(self._size)) % self.max_texts
        lengths = _histogram(self._length[live], self._length_edges)
        result = {
            ("token_length", "psi"): psi(self._length_ref, lengths),
            ("unknown_token_ratio", "ratio_delta"): float(self._unknown[live].mean())
            - self._unknown_ref,
        }
        if self._category_ref is not None and self._categories is not None:
            counts = self._categories[live].sum(axis=0, dtype=np.float64)
            # No entity at all on one side (a token classifier) leaves nothing to compare.
            if counts.sum() > 0 and self._category_ref.sum() > 0:
                result[(self.task.category_feature, "psi")] = psi(self._category_ref, counts)
        value_shares = _histogram(self._value[live], self._value_edges)
        result[(self.task.value_key, "psi")] = psi(self._value_ref, value_shares)
        if self._centroid_ref is not None:
            assert self._unit is not None
            result[("centroid", "cosine_distance")] = _cosine_distance(
                self._unit[live].mean(axis=0, dtype=np.float64), self._centroid_ref
            )
        return result

    def _expire(self, now: float) -> None:
        """Drop the texts older than ``max_age_s``. Times only grow along the ring, so a
        binary search finds how many of the oldest are out: O(log max_texts)."""
        cutoff = now - self.max_age_s
        lo, hi = 0, self._size
        while lo < hi:
            mid = (lo + hi) // 2
            if self._time[(self._start + mid) % self.max_texts] < cutoff:
                lo = mid + 1
            else:
                hi = mid
        self._start = (self._start + lo) % self.max_texts
        self._size -= lo


def _cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    denominator = float(np.linalg.norm(a) * np.linalg.norm(b))
    if denominator == 0.0:
        return 1.0  # a zero centroid points nowhere: as far as it gets from any direction
    return float(1.0 - np.dot(a, b) / denominator)
