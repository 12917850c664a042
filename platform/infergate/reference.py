"""Reference statistics taken at registration, the baseline that drift is measured against.

Pure numpy. The histograms keep their bin edges so the serving path bins live traffic
the same way (PSI needs identical bins on both sides).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

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
) -> dict[str, Any]:
    """Statistics of a reference text set run through the registered model.

    ``outputs`` are class probabilities (text-classification) or raw, not yet
    normalised embeddings (feature-extraction).
    """
    stats: dict[str, Any] = {
        "n_texts": len(lengths),
        "token_length": asdict(Histogram.of(lengths, TOKEN_LENGTH_EDGES)),
        "token_length_mean": float(np.mean(lengths)),
        "unknown_token_ratio_mean": float(np.mean(unknown_ratio)),
    }
    if task == "text-classification":
        predicted = outputs.argmax(axis=-1)
        shares = np.bincount(predicted, minlength=len(labels)) / max(len(predicted), 1)
        stats["class_distribution"] = dict(zip(labels, shares.tolist(), strict=True))
        stats["confidence"] = asdict(Histogram.of(outputs.max(axis=-1), CONFIDENCE_EDGES))
        stats["confidence_mean"] = float(outputs.max(axis=-1).mean())
    else:
        norms = np.linalg.norm(outputs, axis=-1)
        stats["embedding_norm"] = asdict(Histogram.of(norms, quantile_edges(norms)))
        stats["embedding_norm_mean"] = float(norms.mean())
        unit = outputs / np.maximum(norms[:, None], 1e-12)
        stats["centroid"] = unit.mean(axis=0).astype(float).round(6).tolist()
    return stats
