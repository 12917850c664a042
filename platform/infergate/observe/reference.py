"""Reference statistics taken at registration, the baseline that drift is measured against.

Pure numpy. The histograms keep their bin edges so the serving path bins live traffic
the same way (PSI needs identical bins on both sides).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from infergate.tasks import Figures

# Token counts include special tokens; the last bin is open-ended.
TOKEN_LENGTH_EDGES = (0.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, float("inf"))
CONFIDENCE_EDGES = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0 + 1e-9)


@dataclass(frozen=True)
class Histogram:
    edges: list[float]
    counts: list[int]

    @classmethod
    def of(cls, values: np.ndarray, edges: Sequence[float]) -> Histogram:
        counts, _ = np.histogram(np.asarray(values, dtype=np.float64), bins=np.asarray(edges))
        return cls(edges=[float(e) for e in edges], counts=[int(c) for c in counts])

    def shares(self) -> np.ndarray:
        counts = np.asarray(self.counts, dtype=np.float64)
        return counts / max(counts.sum(), 1.0)


def quantile_edges(values: np.ndarray, bins: int = 10) -> list[float]:
    """Decile edges of the reference, opened at both ends so live values always land."""
    inner = np.unique(np.quantile(values, np.linspace(0, 1, bins + 1)[1:-1]))
    return [float("-inf"), *(float(e) for e in inner), float("inf")]


def reference_stats(
    task: str,
    lengths: np.ndarray,
    unknown_ratio: np.ndarray,
    outputs: np.ndarray,
    labels: Sequence[str] = (),
    figures: Figures | None = None,
) -> dict[str, Any]:
    """Statistics of a reference text set run through the registered model.

    ``outputs`` are what the task's statistics are taken from (``Prediction.raw``): class
    probabilities (text-classification), raw, not yet normalised embeddings
    (feature-extraction), ...; ``figures`` their per-text figures if already taken.
    """
    from infergate import tasks

    served = tasks.get(task)
    if figures is None:
        figures = served.figures(outputs, None, labels)
    stats: dict[str, Any] = {
        "n_texts": len(lengths),
        "token_length": asdict(Histogram.of(lengths, TOKEN_LENGTH_EDGES)),
        "token_length_mean": float(np.mean(lengths)),
        "unknown_token_ratio_mean": float(np.mean(unknown_ratio)),
    }
    values = figures.values
    edges = served.value_edges or quantile_edges(values)
    stats[served.value_key] = asdict(Histogram.of(values, edges))
    stats[f"{served.value_key}_mean"] = float(values.mean())
    if served.category_key and figures.categories is not None:
        counts = figures.categories.sum(axis=0)
        shares = counts / max(float(counts.sum()), 1.0)
        names = figures.names or tuple(str(i) for i in range(len(counts)))
        stats[served.category_key] = dict(zip(names, shares.tolist(), strict=True))
    if served.centroid:
        unit = outputs / np.maximum(values[:, None], 1e-12)
        stats["centroid"] = unit.mean(axis=0).astype(float).round(6).tolist()
    return stats
