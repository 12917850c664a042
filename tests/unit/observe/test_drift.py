import math

import numpy as np
import pytest

from fakes import FakeClock
from infergate.observe.drift import DriftWindow, psi
from infergate.observe.reference import reference_stats

LABELS = ["negative", "neutral", "positive"]


def test_psi_hand_computed():
    # (0.3 - 0.5) ln(0.3 / 0.5) + (0.3 - 0.3) ln(1) + (0.4 - 0.2) ln(0.4 / 0.2)
    # = (-0.2)(-0.5108256) + 0 + 0.2 (0.6931472) = 0.1021651 + 0.1386294 = 0.2407946
    assert psi([0.5, 0.3, 0.2], [0.3, 0.3, 0.4]) == pytest.approx(0.2407946, abs=1e-6)


def test_psi_accepts_counts_like_shares():
    # Counts 50/30/20 and 30/30/40 are the shares above.
    assert psi([50, 30, 20], [3, 3, 4]) == pytest.approx(0.2407946, abs=1e-6)


def test_psi_smooths_an_empty_bin_with_eps():
    # The reference's third bin is empty: floored at eps = 1e-4.
    # (0.5 - 0.5) ln(1) + (0.4 - 0.5) ln(0.4 / 0.5) + (0.1 - 0.0001) ln(0.1 / 0.0001)
    # = 0 + (-0.1)(-0.2231436) + 0.0999 (6.9077553) = 0.0223144 + 0.6900848 = 0.7123992
    assert psi([0.5, 0.5, 0.0], [0.5, 0.4, 0.1]) == pytest.approx(0.7123992, abs=1e-6)
    # With eps = 0.01: 0.0223144 + (0.1 - 0.01) ln(10) = 0.0223144 + 0.2072327 = 0.2295470
    assert psi([0.5, 0.5, 0.0], [0.5, 0.4, 0.1], eps=0.01) == pytest.approx(0.2295470, abs=1e-6)


def test_psi_rejects_mismatched_or_empty_inputs():
    with pytest.raises(ValueError, match="same length"):
        psi([0.5, 0.5], [1.0])
    with pytest.raises(ValueError, match="at least one observation"):
        psi([0.5, 0.5], [0, 0])


def _classification_reference(rng: np.random.Generator, n: int = 2000) -> dict:
    lengths, unknown, probs = _classification_traffic(rng, n)
    return reference_stats("text-classification", lengths, unknown, probs, LABELS)


def _classification_traffic(rng: np.random.Generator, n: int, *, shift: bool = False):
    lengths = rng.integers(60, 200, n) if shift else rng.integers(5, 60, n)
    unknown = np.full(n, 0.2 if shift else 0.01)
    logits = rng.normal(size=(n, 3))
    if shift:
        logits[:, 2] += 4.0  # nearly everything "positive", with high confidence
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return lengths, unknown, probs


def test_identical_distribution_scores_about_zero():
    rng = np.random.default_rng(0)
    reference = _classification_reference(rng)
    window = DriftWindow(reference, "text-classification", clock=FakeClock())
    lengths, unknown, probs = _classification_traffic(rng, 2000)
    for start in range(0, 2000, 32):  # requests of 32 texts
        end = start + 32
        window.add(lengths[start:end], unknown[start:end], probs[start:end])
    scores = window.scores()
    assert set(scores) == {
        ("token_length", "psi"),
        ("confidence", "psi"),
        ("predicted_class", "psi"),
        ("unknown_token_ratio", "ratio_delta"),
    }
    for key in [("token_length", "psi"), ("confidence", "psi"), ("predicted_class", "psi")]:
        assert scores[key] < 0.02, key
    assert scores[("unknown_token_ratio", "ratio_delta")] == pytest.approx(0.0)


def test_shifted_distribution_exceeds_major_threshold():
    rng = np.random.default_rng(1)
    window = DriftWindow(_classification_reference(rng), "text-classification", clock=FakeClock())
    window.add(*_classification_traffic(rng, 500, shift=True))
    scores = window.scores()
    assert scores[("token_length", "psi")] > 0.25
    assert scores[("predicted_class", "psi")] > 0.25
    assert scores[("confidence", "psi")] > 0.25
    assert scores[("unknown_token_ratio", "ratio_delta")] == pytest.approx(0.19)


def test_window_scores_match_hand_computed_psi_on_reference_bins():
    # Reference token lengths: 10 texts in bin [8, 16), 10 in [16, 32); classes 50/50.
    reference = reference_stats(
        "text-classification",
        np.array([10] * 10 + [20] * 10),
        np.zeros(20),
        np.array([[0.9, 0.05, 0.05]] * 10 + [[0.05, 0.9, 0.05]] * 10),
        LABELS,
    )
    window = DriftWindow(reference, "text-classification", min_texts=4, clock=FakeClock())
    # Live: 3 texts in [8, 16), 1 in [16, 32); predicted classes 3 x negative, 1 x neutral.
    window.add(
        np.array([9, 12, 15, 30]),
        np.zeros(4),
        np.array([[0.9, 0.05, 0.05]] * 3 + [[0.05, 0.9, 0.05]]),
    )
    scores = window.scores()
    # Shares 0.5/0.5 -> 0.75/0.25 (other bins empty on both sides: eps vs eps adds 0):
    # (0.75 - 0.5) ln(0.75 / 0.5) + (0.25 - 0.5) ln(0.25 / 0.5)
    # = 0.25 (0.4054651) + (-0.25)(-0.6931472) = 0.1013663 + 0.1732868 = 0.2746531
    assert scores[("token_length", "psi")] == pytest.approx(0.2746531, abs=1e-6)
    # Classes: 0.5/0.5/0 -> 0.75/0.25/0, the same arithmetic.
    assert scores[("predicted_class", "psi")] == pytest.approx(0.2746531, abs=1e-6)
    # Confidence 0.9 falls in the reference bin [0.9, 0.95) on both sides.
    assert scores[("confidence", "psi")] == pytest.approx(0.0)


def test_too_few_texts_give_no_scores():
    rng = np.random.default_rng(2)
    window = DriftWindow(_classification_reference(rng), "text-classification", clock=FakeClock())
    window.add(*_classification_traffic(rng, 49))
    assert window.count == 49
    assert window.scores() == {}
    window.add(*_classification_traffic(rng, 1))
    assert window.scores() != {}


def test_expiry_by_count_keeps_the_newest_texts():
    rng = np.random.default_rng(3)
    window = DriftWindow(
        _classification_reference(rng), "text-classification", max_texts=100, clock=FakeClock()
    )
    window.add(*_classification_traffic(rng, 80, shift=True))
    assert window.count == 80
    window.add(*_classification_traffic(rng, 70))  # pushes 50 shifted texts out
    assert window.count == 100
    window.add(*_classification_traffic(rng, 30))  # the last 30 shifted ones go too
    assert window.count == 100
    assert window.scores()[("unknown_token_ratio", "ratio_delta")] == pytest.approx(0.0)
    window.add(*_classification_traffic(rng, 250, shift=True))  # a batch over the capacity
    assert window.count == 100
    assert window.scores()[("unknown_token_ratio", "ratio_delta")] == pytest.approx(0.19)


def test_expiry_by_age_with_a_fake_clock():
    rng = np.random.default_rng(4)
    clock = FakeClock()
    window = DriftWindow(
        _classification_reference(rng), "text-classification", max_age_s=60, clock=clock
    )
    window.add(*_classification_traffic(rng, 100, shift=True))
    clock.now += 30
    window.add(*_classification_traffic(rng, 60))
    assert window.count == 160
    clock.now += 30.5  # the shifted batch is now 60.5 s old, the other 30.5 s
    assert window.count == 60
    assert window.scores()[("unknown_token_ratio", "ratio_delta")] == pytest.approx(0.0)
    clock.now += 30
    assert window.count == 0
    assert window.scores() == {}


def test_texts_past_their_age_leave_even_when_the_ring_wraps_over_them():
    rng = np.random.default_rng(6)
    clock = FakeClock()
    window = DriftWindow(
        _classification_reference(rng),
        "text-classification",
        max_texts=100,
        max_age_s=60,
        min_texts=10,
        clock=clock,
    )
    window.add(*_classification_traffic(rng, 80, shift=True))
    clock.now += 61
    # Writes slots 80-99 and 0-29, over 30 of the expired texts; the other 50 expire when
    # the window is read, by scores() as by count.
    window.add(*_classification_traffic(rng, 50))
    assert window.scores()[("unknown_token_ratio", "ratio_delta")] == pytest.approx(0.0)
    assert window.count == 50


def test_embedding_scores():
    rng = np.random.default_rng(5)
    dim = 16
    direction = rng.normal(size=dim)

    def traffic(n: int, scale: float, angle_shift: bool = False) -> np.ndarray:
        base = -direction if angle_shift else direction
        return scale * (base + 0.3 * rng.normal(size=(n, dim)))

    reference = reference_stats(
        "feature-extraction", rng.integers(5, 60, 1000), np.zeros(1000), traffic(1000, 1.0)
    )
    window = DriftWindow(reference, "feature-extraction", clock=FakeClock())
    window.add(rng.integers(5, 60, 1000), np.zeros(1000), traffic(1000, 1.0))
    same = window.scores()
    assert set(same) == {
        ("token_length", "psi"),
        ("embedding_norm", "psi"),
        ("centroid", "cosine_distance"),
        ("unknown_token_ratio", "ratio_delta"),
    }
    assert same[("embedding_norm", "psi")] < 0.05
    assert same[("centroid", "cosine_distance")] < 0.01

    # Models answer float32; the window takes it as it is.
    single = DriftWindow(reference, "feature-extraction", clock=FakeClock())
    single.add(rng.integers(5, 60, 1000), np.zeros(1000), traffic(1000, 1.0).astype(np.float32))
    assert single.scores()[("embedding_norm", "psi")] < 0.05
    assert single.scores()[("centroid", "cosine_distance")] < 0.01

    shifted = DriftWindow(reference, "feature-extraction", clock=FakeClock())
    shifted.add(rng.integers(5, 60, 200), np.zeros(200), traffic(200, 3.0, angle_shift=True))
    scores = shifted.scores()
    assert scores[("embedding_norm", "psi")] > 0.25
    # The opposite direction: cosine similarity about -1, distance about 2.
    assert scores[("centroid", "cosine_distance")] > 1.9


def test_reference_edges_survive_a_json_round_trip_with_nulls():
    reference = reference_stats(
        "feature-extraction", np.array([5] * 60), np.zeros(60), np.ones((60, 4))
    )
    reference["embedding_norm"]["edges"][0] = None  # as orjson writes -inf
    reference["embedding_norm"]["edges"][-1] = None
    window = DriftWindow(reference, "feature-extraction", clock=FakeClock())
    window.add(np.array([5] * 60), np.zeros(60), np.ones((60, 4)) * 100)
    assert math.isfinite(window.scores()[("embedding_norm", "psi")])


def test_mismatched_class_count_is_a_clear_error():
    rng = np.random.default_rng(6)
    window = DriftWindow(_classification_reference(rng), "text-classification", clock=FakeClock())
    with pytest.raises(ValueError, match="3 classes"):
        window.add(np.array([5]), np.zeros(1), np.array([[0.5, 0.5]]))


def test_texts_added_together_keep_the_times_given_and_age_out_by_them():
    rng = np.random.default_rng(8)
    clock = FakeClock(100.0)
    window = DriftWindow(
        _classification_reference(rng), "text-classification", max_age_s=60, clock=clock
    )
    lengths, unknown, probs = _classification_traffic(rng, 100)
    at = np.repeat([100.0, 130.0], 50)  # two requests, 30 s apart, added at 140
    clock.now = 140.0
    window.add(lengths, unknown, probs, at=at)
    clock.now = 160.5  # the first request's texts are 60.5 s old, the second's 30.5
    assert window.count == 50
    with pytest.raises(ValueError, match="one time per text"):
        window.add(lengths, unknown, probs, at=at[:3])
