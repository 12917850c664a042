"""The shadow stage: sequential tests on mirrored pairs, and a rollout through it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fakes import FakeClock, MemoryRegistry
from infergate import tasks
from infergate.control.policy import RolloutPolicy
from infergate.control.report import REPORT_CHARS, report_text
from infergate.control.rollouts import Rollouts
from infergate.control.shadow import Sprt, agreement_test, analyse_shadow, latency_test
from infergate.errors import InvalidInput
from infergate.observe.counters import ShadowCounters, VersionCounters
from infergate.registry import RegisteredModel
from infergate.versions import CANARY, CHAMPION, Shadow

POLICY = RolloutPolicy()
CLASSIFIER_FLOOR = tasks.get("text-classification").shadow_agreement


def simulate(test: Sprt, rate: float, runs: int = 4000, per_round: int = 8) -> dict[str, float]:
    """Each run: texts disagreeing with probability ``rate`` arrive ``per_round`` at a time,
    as between two analysis rounds, until the test decides."""
    rng = np.random.default_rng(7)
    verdicts, texts = [], []
    for _ in range(runs):
        failures = trials = 0
        verdict = "continue"
        while verdict == "continue" and trials < 10_000:
            failures += int((rng.random(per_round) < rate).sum())
            trials += per_round
            verdict = test.verdict(failures, trials)
        verdicts.append(verdict)
        texts.append(trials)
    return {"rollback": verdicts.count("reject") / runs, "median_texts": float(np.median(texts))}


@pytest.mark.parametrize("task", sorted(tasks.TASKS))
def test_a_version_at_the_floor_is_rolled_back_in_under_one_percent_of_rollouts(task):
    test = agreement_test(POLICY, tasks.get(task).shadow_agreement)
    at_floor = simulate(test, rate=test.p0)
    assert at_floor["rollback"] <= 0.01, at_floor
    identical = simulate(test, rate=0.0, runs=200)
    assert identical == {"rollback": 0.0, "median_texts": 16.0}


def test_a_version_that_disagrees_on_most_texts_is_rolled_back_within_a_few_pairs():
    test = agreement_test(POLICY, CLASSIFIER_FLOOR)
    assert (test.p0, test.p1) == pytest.approx((0.05, 0.30))
    assert test.failures_to_reject() == 3  # swapped labels: every text disagrees
    assert test.verdict(3, 3) == "reject" and test.verdict(2, 2) == "continue"
    most = simulate(test, rate=0.8)
    assert most["rollback"] == 1.0 and most["median_texts"] == 8.0
    bad = simulate(test, rate=test.p1)
    assert bad["rollback"] >= 0.99, bad


def test_a_slower_version_is_told_apart_on_latency():
    test = latency_test(POLICY)
    assert simulate(test, 0.2, per_round=2)["rollback"] <= 0.01
    assert simulate(test, 0.6, per_round=2)["rollback"] >= 0.99
    assert test.failures_to_reject() == 5


def counted(texts: int, disagreement: float = 0.0, **more: int) -> ShadowCounters:
    return ShadowCounters(texts=texts, disagreement=disagreement, **more)


def test_shadow_decisions_and_their_reasons():
    def decide(shadow: ShadowCounters, champion_errors: float = 0.0):
        return analyse_shadow(POLICY, shadow, CLASSIFIER_FLOOR, champion_errors)

    swapped = decide(counted(4, 4.0, requests=2))
    assert swapped.action == "rollback"
    assert swapped.reason.startswith("in shadow: agrees with the champion on 0% of texts")
    assert swapped.figures["shadow_agreement"] == 0.0
    failing = decide(counted(12, 12.0, requests=12, errors=12))
    assert failing.action == "rollback" and "fails 100% of mirrored requests" in failing.reason
    slow = decide(counted(10, 0.0, requests=6, slower=6))
    assert slow.action == "rollback" and "slower than the champion on 6 of 6" in slow.reason
    few = decide(counted(20, 0.0, requests=20))  # the test accepts, but under min_pairs
    assert few.action == "wait" and "no decision yet" in few.reason
    passed = decide(counted(40, 0.0, requests=40))
    assert passed.action == "advance"
    assert (
        passed.reason
        == "shadow passed: agreement 100.0% over 40 texts, 40 requests mirrored; next 10%"
    )


def test_an_automatic_rollout_goes_through_shadow_then_the_steps():
    registry = MemoryRegistry(RegisteredModel("a", "text-classification", {CHAMPION: "1"}, {}))
    counters = {"a/1": VersionCounters(), "a/2": VersionCounters()}
    rollouts = Rollouts(registry, stats=lambda: dict(counters), clock=FakeClock())
    assert rollouts.start("a", "2", weight=None, mode="auto").to_dict()["shadow"] is True
    canary = {v.role: v for v in rollouts.desired()}[CANARY]
    assert (canary.weight, canary.shadow) == (0, Shadow(0.25, 1.5, 5.0))
    rollouts.tick()  # the shadow's window starts here
    counters["a/2"] = VersionCounters(shadow=counted(40, 0.0, requests=40))
    assert rollouts.shadow_tests() == {"a": {"agreement": 0.0, "latency": 0.0}}  # no data
    ((_, decision),) = rollouts.tick()
    assert decision.action == "advance" and rollouts.shadow_tests() == {}
    state = rollouts.status("a").state
    assert state is not None and (state.shadow, state.weight, state.step) == (False, 10, 0)
    canary = {v.role: v for v in rollouts.desired()}[CANARY]
    assert (canary.weight, canary.shadow) == (10, None)


def test_a_canary_rolled_back_in_shadow_never_had_weight():
    registry = MemoryRegistry(RegisteredModel("a", "text-classification", {CHAMPION: "1"}, {}))
    counters = {"a/1": VersionCounters(), "a/2": VersionCounters()}
    rollouts = Rollouts(registry, stats=lambda: dict(counters), clock=FakeClock())
    registry.set_alias("a", CANARY, "2")  # as an MLflow client does
    assert [v.weight for v in rollouts.desired()] == [100, 0]
    rollouts.tick()
    counters["a/2"] = VersionCounters(shadow=counted(3, 3.0, requests=1))
    ((_, decision),) = rollouts.tick()
    assert decision.action == "rollback"
    assert CANARY not in registry.model("a").aliases
    tags = registry.version_tags[("a", "2")]
    assert tags["infergate.rollback_reason"].startswith("in shadow: agrees with the champion")
    trail = json.loads(tags["infergate.rollout_report"])  # the decision trail, with figures
    assert [entry["action"] for entry in trail] == ["start", "rollback"]
    assert trail[-1]["figures"]["shadow_texts"] == 3 and trail[-1]["figures"]["agreement_llr"] > 4.6


def test_the_report_keeps_within_a_tags_limit_end_first():
    trail = [{"at": i, "action": "advance", "reason": "x" * 100, "figures": {"f": 1.0}}
             for i in range(100)]  # fmt: skip
    kept = json.loads(report_text(trail))
    assert len(report_text(trail)) <= REPORT_CHARS
    assert kept[-1] == trail[-1] and kept[0]["at"] > 0 and "figures" not in kept[0]


def test_manual_and_weighted_starts_and_a_zero_share_skip_the_shadow():
    def started(tags: dict[str, str] | None = None, **kw):
        model = RegisteredModel("a", "text-classification", {CHAMPION: "1"}, dict(tags or {}))
        rollouts = Rollouts(MemoryRegistry(model), stats=dict, clock=FakeClock())
        return rollouts.start("a", "2", **kw).to_dict()

    assert started(weight=None, mode="auto")["shadow"] is True
    assert started(weight=None, mode="auto", shadow=False)["weight"] == 10
    assert started(weight=30, mode="auto")["shadow"] is False
    assert started(weight=30, mode="manual")["shadow"] is False
    zero = {"infergate.rollout.policy.shadow_share": "0"}
    assert started(zero, weight=None, mode="auto")["weight"] == 10
    with pytest.raises(InvalidInput, match=r"shadow_share must be within 0\.\.1"):
        started({"infergate.rollout.policy.shadow_share": "2"}, weight=None, mode="auto")
