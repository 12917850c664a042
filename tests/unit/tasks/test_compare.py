"""Each task's paired comparison of a canary's answers with its champion's (shadow stage)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from infergate import tasks
from infergate.serving.runtime import Prediction, Timings


def answered(task: str, outputs: Any, raw: Any, labels: list[str] | None = None) -> Prediction:
    return Prediction(outputs, None, np.asarray(raw, dtype=np.float64), Timings(), labels or [],
                      task=task)  # type: ignore[arg-type]  # fmt: skip


def test_ranking_keeps_order_per_text_and_a_lone_score_within_a_margin():
    task = tasks.get("text-ranking")
    champion = answered(task.name, None, [[0.9], [0.5], [0.1]])
    same_order = answered(task.name, None, [[0.6], [0.4], [0.2]])
    paired = task.compare(champion, same_order, ["a", "b", "c"])
    assert paired.agreement.tolist() == [1.0, 1.0, 1.0] and paired.change == pytest.approx(0.3)
    first_two_swapped = answered(task.name, None, [[0.5], [0.9], [0.1]])
    assert task.compare(champion, first_two_swapped, list("abc")).agreement.tolist() == [
        0.5, 0.5, 1.0
    ]  # fmt: skip
    lone = task.compare(
        answered(task.name, None, [[0.9]]), answered(task.name, None, [[0.3]]), ["a"]
    )
    assert lone.agreement.tolist() == [0.0]


def test_token_classification_compares_entities_by_type_and_span():
    task = tasks.get("token-classification")
    per = {"entity": "PER", "score": 0.9, "start": 0, "end": 4}
    loc = {"entity": "LOC", "score": 0.8, "start": 10, "end": 15}
    champion = answered(task.name, [[per, loc], [per]], np.zeros((2, 1)))
    canary = answered(task.name, [[per, loc], [{**per, "entity": "ORG"}]], np.zeros((2, 1)))
    paired = task.compare(champion, canary, ["x", "y"])
    assert paired.agreement.tolist() == [1.0, 0.0] and paired.change == 1.0


def test_sparse_vectors_agree_by_cosine_and_another_vocabulary_never():
    task = tasks.get("sparse-embedding")
    weights = np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    close = weights + np.array([[0.1, 0.0, 0.0], [2.0, 0.0, 2.0]])
    paired = task.compare(
        answered(task.name, None, weights), answered(task.name, None, close), ["a", "b"]
    )
    assert paired.agreement.tolist() == [1.0, 0.0]
    other = answered(task.name, None, np.ones((2, 5)))
    assert task.compare(answered(task.name, None, weights), other, ["a", "b"]).change == 1.0


def test_translation_agrees_by_chrf_against_the_champions_translation():
    task = tasks.get("translation")
    champion = answered(task.name, [{"translation_text": "Das Haus ist klein."}] * 2, [[0]])
    canary = answered(task.name, [{"translation_text": "Das Haus ist klein!"},
                                  {"translation_text": "Ich esse gern Brot."}], [[0]])  # fmt: skip
    paired = task.compare(champion, canary, ["The house is small."] * 2)
    assert paired.agreement.tolist() == [1.0, 0.0]


def test_embeddings_compare_neighbours_in_a_window_not_vector_to_vector():
    """Another space with the same neighbours agrees (a rotation); other weights do not."""
    task = tasks.get("feature-extraction")
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(40, 8))
    rotation = np.linalg.qr(rng.normal(size=(8, 8)))[0]
    texts = [f"text {i}" for i in range(40)]
    rotated, unrelated = task.comparison(), task.comparison()
    agree_rotated, agree_unrelated = [], []
    for i in range(0, 40, 4):
        ours = answered(task.name, None, vectors[i : i + 4])
        turned = answered(task.name, None, vectors[i : i + 4] @ rotation)
        other = answered(task.name, None, rng.normal(size=(4, 8)))
        agree_rotated += rotated(ours, turned, texts[i : i + 4]).agreement.tolist()
        agree_unrelated += unrelated(ours, other, texts[i : i + 4]).agreement.tolist()
    assert len(agree_rotated) == 36  # the first four only fill the window
    assert np.mean(agree_rotated) == 1.0 and np.mean(agree_unrelated) < 0.5
    # A text seen before is no new evidence: it would find itself.
    again = rotated(
        answered(task.name, None, vectors[:1]), answered(task.name, None, vectors[:1]), texts[:1]
    )
    assert again.agreement.size == 0
