import pytest

from infergate.rollout import (
    RolloutPolicy,
    RolloutState,
    VersionWindow,
    analyse,
    apply,
    check_weight,
    start,
)

POLICY = RolloutPolicy(steps=(10, 50, 100), step_interval_s=60, min_requests=20)
HEALTHY = VersionWindow(requests=100, errors=0, p95_ms=10.0, output_shares=(0.5, 0.5))


def window(**kw) -> VersionWindow:
    return VersionWindow(**{**HEALTHY.__dict__, **kw})


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


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


def test_latency_ratio_rolls_back_but_tiny_latencies_do_not():
    state = start("2", POLICY, 0.0)
    assert analyse(POLICY, state, window(p95_ms=20.0), HEALTHY, 1.0).action == "rollback"
    fast = window(p95_ms=1.0)
    assert analyse(POLICY, state, window(p95_ms=3.0), fast, 1.0).action == "wait"


def test_output_divergence_rolls_back():
    state = start("2", POLICY, 0.0)
    # PSI of (0.5, 0.5) -> (0.9, 0.1): 0.4*ln(1.8) + (-0.4)*ln(0.2) = 0.8789
    decision = analyse(POLICY, state, window(output_shares=(0.9, 0.1)), HEALTHY, 1.0)
    assert decision.action == "rollback"
    assert decision.figures["output_psi"] == pytest.approx(0.4 * 0.587787 + 0.4 * 1.609438, 1e-4)


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
