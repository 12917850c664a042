from dataclasses import replace
from statistics import NormalDist

import numpy as np
import pytest

from fakes import FakeClock
from infergate.control.policy import (
    SLOWER_Z,
    RolloutPolicy,
    RolloutState,
    analyse,
    apply,
    check_weight,
    chi2_bound,
    look_level,
    shares_chi2,
    slower_z,
    start,
)
from infergate.observe.counters import VersionCounters, VersionWindow, merge_reports
from infergate.observe.metrics import LATENCY_BUCKETS_S

# The weighted steps (the shadow stage: tests/unit/control/test_shadow.py).
POLICY = RolloutPolicy(steps=(10, 50, 100), step_interval_s=60, min_requests=20, shadow_share=0)
HEALTHY = VersionWindow(requests=100, errors=0, p95_ms=10.0, output_shares=(0.5, 0.5))


def window(**kw) -> VersionWindow:
    return VersionWindow(**{**HEALTHY.__dict__, **kw})


def test_auto_rollout_walks_every_step_then_promotes():
    clock = FakeClock()
    state = start("2", POLICY, clock.now)
    assert (state.weight, state.step) == (10, 0)
    seen = []
    for _ in range(5):
        decision = analyse(POLICY, state, HEALTHY, HEALTHY, clock.advance(61))
        seen.append(decision.action)
        if decision.action == "promote":
            break
        state = apply(POLICY, state, decision, clock.now)
    assert seen == ["advance", "advance", "promote"]
    assert state.weight == 100


def test_waits_for_the_step_interval_and_for_traffic():
    clock = FakeClock()
    state = start("2", POLICY, clock.now)
    assert analyse(POLICY, state, HEALTHY, HEALTHY, clock.advance(30)).action == "wait"
    few = window(requests=5)
    decision = analyse(POLICY, state, few, HEALTHY, clock.advance(60))
    assert decision.action == "wait" and "5/20" in decision.reason


def test_error_rate_rolls_back_with_figures():
    state = start("2", POLICY, 0.0)
    decision = analyse(POLICY, state, window(errors=10), HEALTHY, 10.0)
    assert decision.action == "rollback"
    assert "error rate 10.0%" in decision.reason
    assert decision.figures["canary_error_rate"] == pytest.approx(0.1)


def test_a_broken_canary_rolls_back_before_the_minimum_sample():
    state = start("2", POLICY, 0.0)
    decision = analyse(POLICY, state, window(requests=10, errors=10), HEALTHY, 1.0)
    assert decision.action == "rollback"


def timed(*milliseconds: float) -> VersionWindow:
    """A window of requests that took these times, counted as the replicas count them."""
    counters = VersionCounters(requests=len(milliseconds))
    for ms in milliseconds:
        counters.latency[int(np.searchsorted(LATENCY_BUCKETS_S, ms / 1e3))] += 1
    return replace(counters.window(), output_shares=HEALTHY.output_shares)


def spread(center_ms: float, n: int = 100) -> tuple[float, ...]:
    return tuple(center_ms * (0.8 + 0.4 * i / n) for i in range(n))


def test_latency_is_judged_at_the_end_of_the_step_unless_the_evidence_is_overwhelming():
    state = start("2", POLICY, 0.0)
    # 20 requests a little slower, four of them three times: past the step's bounds
    # (p95 1.9x, z 3.0 > 2.33), not yet past a look's before its end (3.6 for 60 s at 1 %).
    slow, champion = timed(*spread(11.0, 16), *[30.0] * 4), timed(*spread(10.0, 300))
    early = analyse(POLICY, state, slow, champion, 1.0)
    assert early.action == "wait" and early.figures["p95_ratio"] > 1.8
    assert SLOWER_Z < early.figures["slower_z"] < NormalDist().inv_cdf(1 - look_level(POLICY))
    late = analyse(POLICY, state, slow, champion, 61.0)
    assert late.action == "rollback" and "p95 latency" in late.reason
    assert late.figures["output_psi"] == 0.0  # all shown
    # Every request twice as slow, over 100: overwhelming (z > 10), rolled back at once.
    at_once = analyse(POLICY, state, timed(*spread(20.0)), champion, 1.0)
    assert at_once.action == "rollback" and "before the step's end" in at_once.reason


def test_latency_within_the_margin_or_slower_only_in_its_tail_passes():
    state = start("2", POLICY, 0.0)
    # 3x the champion's p95, but 2 ms apart: within the 5 ms margin.
    fast = analyse(POLICY, state, timed(*spread(3.0)), timed(*spread(1.0, 300)), 61.0)
    assert fast.action == "advance"
    # Eight slow requests of 100 push the p95 to 2x; the requests as a whole are no slower.
    tail = timed(*spread(10.0, 92), *[30.0] * 8)
    decision = analyse(POLICY, state, tail, timed(*spread(10.0, 300)), 61.0)
    assert decision.figures["p95_ratio"] > 1.5 and decision.figures["slower_z"] < SLOWER_Z
    assert decision.action == "advance"


def test_slower_z_compares_whole_histograms():
    same = [0, 10, 50, 30, 10]
    assert slower_z(same, same) == pytest.approx(0.0)
    shifted = [0, 0, 10, 50, 40]
    assert slower_z(shifted, same) > 5 and slower_z(same, shifted) < -5
    assert slower_z([], same) == 0.0 and slower_z([0, 0], [0, 0]) == 0.0


def test_output_divergence_rolls_back_at_the_end_of_the_step_or_at_once_if_certain():
    state = start("2", POLICY, 0.0)
    # PSI of (0.5, 0.5) -> (0.75, 0.25) over 20 requests a side: 0.275, past 0.25, but
    # chance could do it (chi-square 2.7); judged at the step's end.
    leaning = window(requests=20, output_shares=(0.75, 0.25))
    early = analyse(POLICY, state, leaning, window(requests=20), 1.0)
    assert early.action == "wait" and early.figures["output_chi2"] == pytest.approx(2.67, 0.01)
    assert analyse(POLICY, state, leaning, window(requests=20), 61.0).action == "rollback"
    # PSI of (0.5, 0.5) -> (0.9, 0.1): 0.4*ln(1.8) + (-0.4)*ln(0.2) = 0.8789, over 100
    # requests a side (chi-square 38): no chance, rolled back at once.
    decision = analyse(POLICY, state, window(output_shares=(0.9, 0.1)), HEALTHY, 1.0)
    assert decision.action == "rollback" and "before the step's end" in decision.reason
    assert decision.figures["output_psi"] == pytest.approx(0.4 * 0.587787 + 0.4 * 1.609438, 1e-4)


def test_a_canary_with_other_classes_is_rolled_back_at_once_not_passed():
    state = start("2", POLICY, 0.0)
    champion = window(output_shares=(0.8, 0.2), classes=("negative", "positive"))
    three = window(output_shares=(0.0, 0.0, 1.0), classes=("bad", "good", "meh"))
    decision = analyse(POLICY, state, three, champion, 1.0)
    assert decision.action == "rollback" and "--manual" in decision.reason
    assert "classes (bad, good, meh) are not the champion's (negative, positive)" in decision.reason
    renamed = window(output_shares=(0.8, 0.2), classes=("bad", "good"))  # as many, not the same
    assert analyse(POLICY, state, renamed, champion, 1.0).action == "rollback"
    unnamed = window(output_shares=(0.0, 0.0, 1.0))
    assert "3 classes against 2" in analyse(POLICY, state, unnamed, HEALTHY, 1.0).reason
    manual = start("2", POLICY, 0.0, mode="manual", weight=30)
    assert analyse(POLICY, manual, three, champion, 1.0).action == "hold"


def test_classes_numbered_otherwise_are_compared_by_name():
    """A retrained model may number its classes otherwise; by index it would look flipped."""
    state = start("2", POLICY, 0.0)
    champion = window(output_shares=(0.8, 0.2), classes=("negative", "positive"))
    same_answers = window(output_shares=(0.2, 0.8), classes=("positive", "negative"))
    decision = analyse(POLICY, state, same_answers, champion, 61.0)
    assert decision.action == "advance" and decision.figures["output_psi"] == pytest.approx(0)
    flipped = window(output_shares=(0.8, 0.2), classes=("positive", "negative"))
    assert analyse(POLICY, state, flipped, champion, 61.0).action == "rollback"


def test_manual_mode_holds():
    state = start("2", POLICY, 0.0, mode="manual", weight=30)
    assert state.weight == 30
    assert analyse(POLICY, state, HEALTHY, HEALTHY, 1e6).action == "hold"


def test_state_round_trips_through_tags():
    state = apply(POLICY, start("7", POLICY, 5.0), analyse(POLICY, start("7", POLICY, 5.0),
                  HEALTHY, HEALTHY, 100.0), 100.0)  # fmt: skip
    assert RolloutState.from_tags({**state.to_tags(), "other": "x"}) == state
    assert RolloutState.from_tags({"other": "x"}) is None


def test_policy_from_tags():
    policy = RolloutPolicy.from_tags(
        {"infergate.rollout.policy.steps": "5,20,100", "infergate.rollout.policy.min_requests": "3"}
    )
    assert policy.steps == (5, 20, 100) and policy.min_requests == 3
    with pytest.raises(ValueError, match="increase"):
        RolloutPolicy.from_tags({"infergate.rollout.policy.steps": "50,10"})


@pytest.mark.parametrize("weight", [-1, 101])
def test_weights_outside_0_100_are_refused(weight):
    with pytest.raises(ValueError, match=r"0\.\.100"):
        check_weight(weight)


def test_an_automatic_rollout_started_at_a_weight_goes_on_from_the_next_step():
    clock = FakeClock()
    state = start("2", POLICY, clock.now, weight=30)
    assert (state.mode, state.weight, state.step) == ("auto", 30, -1)
    weights = [state.weight]
    for _ in range(4):
        decision = analyse(POLICY, state, HEALTHY, HEALTHY, clock.advance(61))
        if decision.action == "promote":
            break
        assert decision.action == "advance"
        state = apply(POLICY, state, decision, clock.now)
        weights.append(state.weight)
    assert weights == [30, 50, 100] and decision.action == "promote"


def test_an_automatic_rollout_cannot_start_at_weight_0():
    with pytest.raises(ValueError, match="above 0"):
        start("2", POLICY, 0.0, weight=0)
    assert start("2", POLICY, 0.0, mode="manual", weight=0).weight == 0


@pytest.mark.parametrize(
    ("tag", "raw", "expected"),
    [("min_requests", "30.0", "an integer"), ("steps", "10,x", "comma-separated"),
     ("max_latency_ratio", "fast", "a number")],
)  # fmt: skip
def test_a_policy_tag_that_cannot_be_read_is_named(tag, raw, expected):
    with pytest.raises(ValueError, match=rf"infergate\.rollout\.policy\.{tag}=.*{expected}"):
        RolloutPolicy.from_tags({f"infergate.rollout.policy.{tag}": raw})


def test_equal_versions_rarely_fail_and_slow_ones_are_caught():
    # Latencies like this machine's: ~8 ms, 3 % slow outliers (GC, a busy core).
    rng = np.random.default_rng(7)

    def requests(n: int, slower: float = 1.0) -> VersionWindow:
        ms = rng.lognormal(np.log(8.0), 0.3, n)
        outliers = rng.random(n) < 0.03
        ms[outliers] = rng.uniform(20.0, 40.0, outliers.sum())
        return timed(*(ms * slower))

    def failures(n: int, slower: float) -> float:
        state = start("2", POLICY, 0.0)
        runs = [
            analyse(POLICY, state, requests(n, slower), requests(9 * n), 61.0) for _ in range(300)
        ]
        return sum(d.action == "rollback" for d in runs) / len(runs)

    assert failures(30, 1.0) <= 0.02 and failures(100, 1.0) <= 0.02
    assert failures(30, 2.0) >= 0.9 and failures(100, 2.0) >= 0.99


def test_replica_counters_carry_their_classes_to_the_window():
    one, other = VersionCounters(), VersionCounters()
    one.add(200, 0.004, np.array([[0.1, 0.9]]), ["negative", "positive"])
    other.add(200, 0.004, np.array([[0.7, 0.3]]), ["negative", "positive"])
    reports = [{"m/2": one.to_dict()}, {"m/2": other.to_dict()}]  # two replicas, over Ray
    merged = merge_reports(reports)["m/2"]
    baseline = VersionCounters()  # the step's start, before any request
    window = merged.minus(baseline).window()
    assert window.classes == ("negative", "positive") and window.output_shares == (0.5, 0.5)


def test_the_chi_square_of_shares_and_its_bound():
    # A 2x2 table of 50/50 against 90/10 over 100 requests a side: chi-square 38.1.
    chi2, df = shares_chi2((0.9, 0.1), 100, (0.5, 0.5), 100)
    assert (round(chi2, 1), df) == (38.1, 1)
    assert shares_chi2((0.5, 0.5, 0.0), 10, (0.5, 0.5, 0.0), 10) == (0.0, 1)  # unseen class
    # Against exact quantiles: 6.63 (df 1, 1 %), 9.21 (df 2, 1 %), 21.67 (df 9, 1 %).
    for df, exact in ((1, 6.63), (2, 9.21), (9, 21.67)):
        assert exact <= chi2_bound(0.01, df) <= exact * 1.08


def step_looks(rng, canary_p, champion_p, canary_ms, champion_ms, looks=30, per_look=(3, 27)):
    """One step of ``looks`` analyses (a look every 2 s of a 60 s step) over windows
    growing by ``per_look`` requests (a 10 % canary): one text a request, labelled
    positive with probability ``p``, and latencies like this machine's (lognormal around
    ``ms``); the first decision that is not a wait, and its look."""
    state = start("2", POLICY, 0.0)
    sides = [VersionCounters(outputs=[0.0, 0.0], classes=("positive", "negative"))
             for _ in range(2)]  # fmt: skip
    for look in range(1, looks + 1):
        for counters, n, p, ms in zip(sides, per_look, (canary_p, champion_p),
                                      (canary_ms, champion_ms), strict=True):  # fmt: skip
            positive = int(rng.binomial(n, p))
            seconds = rng.lognormal(np.log(ms / 1e3), 0.3, n)
            buckets = np.searchsorted(LATENCY_BUCKETS_S, seconds)
            latency = np.bincount(buckets, minlength=len(counters.latency))
            counters.requests += n
            counters.latency = [a + int(b) for a, b in zip(counters.latency, latency, strict=True)]
            counters.outputs = [counters.outputs[0] + positive, counters.outputs[1] + n - positive]
        decision = analyse(POLICY, state, sides[0].window(), sides[1].window(), 2.0 * look)
        if decision.action != "wait":
            return decision, look
    return decision, looks


def test_an_equal_canary_is_rolled_back_early_in_under_one_percent_of_steps():
    # 500 steps of 29 looks (the 30th is the step's end): 0.2 % of 1,000 seen here.
    rng = np.random.default_rng(11)
    runs = [step_looks(rng, 0.7, 0.7, 8.0, 8.0, looks=29) for _ in range(500)]
    early = sum(d.action == "rollback" for d, _ in runs) / len(runs)
    print(f"\nequal canary rolled back before the step's end in {early:.2%} of steps")
    assert early <= POLICY.false_rollback


def test_a_canary_with_swapped_labels_or_three_times_slower_goes_within_the_step():
    rng = np.random.default_rng(12)
    for canary_p, canary_ms, why in ((0.3, 8.0, "output distribution"),
                                     (0.7, 24.0, "p95 latency")):  # fmt: skip
        looks = []
        for _ in range(200):
            decision, look = step_looks(rng, canary_p, 0.7, canary_ms, 8.0)
            assert decision.action == "rollback" and "before the step's end" in decision.reason
            assert why in decision.reason
            looks.append(look)
        requests = 3 * np.percentile(looks, [50, 99])
        print(f"\n{why}: rolled back after {requests[0]:.0f} canary requests (median), "
              f"{requests[1]:.0f} (99th percentile) of the step's 90")  # fmt: skip
        # min_requests (20) canary requests take 7 looks of 3 requests.
        assert np.median(looks) <= 9 and max(looks) < 30, looks
