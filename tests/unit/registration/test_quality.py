"""infergate.registration.quality: the figures a client of each task feels, and the budget."""

import numpy as np
import pytest

from infergate.registration.quality import Budget, measure, rank_agreement


def test_embeddings_keep_their_neighbours_or_not():
    rng = np.random.default_rng(0)
    original = rng.normal(size=(50, 16))
    same = measure("embeddings", original, original * 3.0)  # scale does not matter
    assert same.keys() == {"cosine_mean", "cosine_worst", "nn_agreement", "recall_at_10"}
    assert all(value == pytest.approx(1.0) for value in same.values())
    shuffled = original[rng.permutation(50)]
    moved = measure("embeddings", original, shuffled)
    assert moved["cosine_mean"] < 0.5 and moved["nn_agreement"] < 0.3
    assert moved["recall_at_10"] < 0.5 and moved["cosine_worst"] < moved["cosine_mean"]


def test_a_small_nudge_keeps_cosine_but_can_swap_close_neighbours():
    original = np.array([[1.0, 0.0], [0.0, 1.0], [0.99, 0.14], [0.98, 0.2]])
    nudged = original + np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.07], [0.0, -0.05]])
    figures = measure("embeddings", original, nudged)
    assert figures["cosine_worst"] > 0.99
    assert figures["nn_agreement"] < 1.0  # text 0's nearest changed from 2 to 3
    assert "recall_at_10" not in figures  # needs more than 10 texts


def test_classifier_figures():
    original = np.log(np.array([[0.9, 0.1], [0.45, 0.55], [0.2, 0.8]]))
    optimised = np.log(np.array([[0.85, 0.15], [0.55, 0.45], [0.2, 0.8]]))
    figures = measure("logits", original, optimised)
    assert figures["label_agreement"] == pytest.approx(2 / 3)
    assert figures["probability_max_change"] == pytest.approx(0.1)
    assert figures["probability_mean_change"] == pytest.approx((0.05 + 0.1 + 0) / 3)


def test_ranking_figures():
    assert rank_agreement(np.array([1.0, 2.0, 3.0]), np.array([1.0, 3.0, 2.0])) == pytest.approx(
        2 / 3
    )
    figures = measure("scores", np.array([[0.0], [2.0], [-1.0]]), np.array([[0.1], [2.0], [-1.0]]))
    assert figures["rank_agreement"] == 1.0 and 0 < figures["score_max_change"] < 0.03


def test_budget_floors_and_ceilings():
    budget = Budget.parse("nn_agreement=0.97,probability_max_change=0.2", "embeddings")
    assert budget.misses({"nn_agreement": 0.98, "probability_max_change": 0.1}) == []
    assert budget.misses({"nn_agreement": 0.9, "probability_max_change": 0.3}) == [
        "nn_agreement 0.9 < 0.97",
        "probability_max_change 0.3 > 0.2",
    ]
    assert budget.misses({"nn_agreement": float("nan"), "probability_max_change": 0.0})
    assert "not measured" in budget.misses({"cosine_mean": 1.0})[0]
    assert budget.describe() == "nn_agreement >= 0.97, probability_max_change <= 0.2"


def test_budget_defaults_none_and_bad_text():
    assert Budget.parse("default", "embeddings") == Budget.default("embeddings")
    assert Budget.default("embeddings").limits == {"cosine_mean": 0.998, "nn_agreement": 0.97}
    assert Budget.parse("none", "logits").misses({}) == []
    with pytest.raises(ValueError, match="NAME=VALUE with NAME one of"):
        Budget.parse("accuracy=0.9", "logits")
    with pytest.raises(ValueError, match="not a number"):
        Budget.parse("label_agreement=high", "logits")


def test_shapes_must_match():
    with pytest.raises(ValueError, match="shapes differ"):
        measure("logits", np.zeros((2, 3)), np.zeros((3, 3)))
