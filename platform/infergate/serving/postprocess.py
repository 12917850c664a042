"""Turning model outputs into answers, per task. Pure numpy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def classification_outputs(
    probabilities: np.ndarray, labels: Sequence[str]
) -> list[dict[str, Any]]:
    """One ``{"label", "score", "scores"}`` per row of class probabilities."""
    best = probabilities.argmax(axis=-1)
    rows = probabilities.tolist()
    return [
        {
            "label": labels[top],
            "score": row[top],
            "scores": dict(zip(labels, row, strict=True)),
        }
        for top, row in zip(best.tolist(), rows, strict=True)
    ]
