import numpy as np
import pytest

from infergate.observe.reference import (
    TOKEN_LENGTH_EDGES,
    Histogram,
    quantile_edges,
    reference_stats,
)
from infergate.serving.postprocess import classification_outputs, l2_normalize, softmax


def test_softmax_matches_hand_computed_values():
    probs = softmax(np.array([[0.0, np.log(3.0)], [1000.0, 1000.0]]))
    np.testing.assert_allclose(probs, [[0.25, 0.75], [0.5, 0.5]])


def test_l2_normalize_gives_unit_vectors_and_keeps_zero():
    out = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]]))
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]])


def test_classification_outputs():
    (first,) = classification_outputs(np.array([[0.2, 0.8]]), ["negative", "positive"])
    assert first["label"] == "positive"
    assert first["score"] == pytest.approx(0.8)
    assert first["scores"] == pytest.approx({"negative": 0.2, "positive": 0.8})


def test_histogram_bins_like_numpy_and_open_last_bin():
    hist = Histogram.of(np.array([1, 9, 9, 17, 600]), TOKEN_LENGTH_EDGES)
    assert hist.counts == [1, 2, 1, 0, 0, 0, 0, 1]
    np.testing.assert_allclose(hist.shares().sum(), 1.0)


def test_quantile_edges_are_open_ended_and_sorted():
    edges = quantile_edges(np.arange(100.0))
    assert edges[0] == -np.inf and edges[-1] == np.inf
    assert edges == sorted(edges) and len(edges) == 11


def test_reference_stats_classification():
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [0.6, 0.4]])
    stats = reference_stats(
        "text-classification",
        np.array([5, 10, 20, 40]),
        np.array([0, 0.5, 0, 0]),
        probs,
        ["negative", "positive"],
    )
    assert stats["n_texts"] == 4
    assert stats["class_distribution"] == {"negative": 0.5, "positive": 0.5}
    assert stats["unknown_token_ratio_mean"] == pytest.approx(0.125)
    assert stats["confidence_mean"] == pytest.approx((0.9 + 0.8 + 0.7 + 0.6) / 4)
    assert sum(stats["confidence"]["counts"]) == 4
    assert stats["token_length"]["counts"][:4] == [1, 1, 1, 1]


def test_reference_stats_embeddings():
    vectors = np.array([[3.0, 4.0], [0.0, 2.0]])
    stats = reference_stats("feature-extraction", np.array([3, 4]), np.zeros(2), vectors)
    assert stats["embedding_norm_mean"] == pytest.approx(3.5)
    np.testing.assert_allclose(stats["centroid"], [0.3, 0.9])
