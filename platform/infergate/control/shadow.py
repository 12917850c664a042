"""The shadow stage of an automatic rollout: judged on the champion's own requests.

While a canary is in shadow it takes no client's request. Front-end replicas mirror a
share of its champion's requests to it after answering them (``infergate.serving.mirror``),
and compare the two answers to the same texts with the task's measure
(``Task.compare``): a label kept, the same entities, the same order, a nearest neighbour
kept... Each compared text agrees (1), or not (0); a mirrored request the canary fails
counts as a disagreement on all its texts, and one it answers more slowly than the
champion answered it counts as slower.

Two sequential probability ratio tests (Wald's SPRT) read those counts at every analysis
round and decide as soon as the evidence allows, rather than at the end of a fixed step:

- agreement: a good canary disagrees on at most ``1 - min_agreement`` of texts (the
  task's floor unless a policy tag sets one), a bad one on ``agreement_margin`` more;
- latency: a good canary answers at most ``SLOWER_OK`` of requests slower than the
  champion answered them, a bad one ``SLOWER_BAD``.

Each test has the error rates ``false_rollback`` (a good canary rolled back) and the same
for a bad one passed. A canary that fails either is rolled back; once both pass, with at
least ``min_pairs`` texts compared, the weighted steps begin. A text is taken as one
observation, as a classifier's texts are judged one by one, so the rates hold for texts
drawn independently; the rates for an identical and a disagreeing version are measured
by simulation in tests/unit/control/test_shadow.py.

Pure: no Ray, Triton or MLflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from infergate.observe.counters import ShadowCounters

if TYPE_CHECKING:
    from infergate.control.policy import Decision, RolloutPolicy

Verdict = Literal["reject", "accept", "continue"]
SLOWER_OK = 0.2  # share of mirrored requests a good canary answers slower (load, chance)
SLOWER_BAD = 0.6


@dataclass(frozen=True)
class Sprt:
    """Wald's sequential test of a failure rate: at most ``p0`` (accept) against at least
    ``p1`` (reject), with error rates ``alpha`` (rejecting at ``p0``) and ``beta``
    (accepting at ``p1``). Failures may be fractions (a text half agreeing)."""

    p0: float
    p1: float
    alpha: float = 0.01
    beta: float = 0.01

    def __post_init__(self) -> None:
        if not 0 < self.p0 < self.p1 < 1:
            raise ValueError(f"a sequential test needs 0 < p0 < p1 < 1, got {self.p0}, {self.p1}")

    def llr(self, failures: float, trials: float) -> float:
        """The log-likelihood ratio of ``p1`` against ``p0`` after ``trials``."""
        fail = math.log(self.p1 / self.p0)
        succeed = math.log((1 - self.p1) / (1 - self.p0))
        return failures * fail + (trials - failures) * succeed

    def verdict(self, failures: float, trials: float) -> Verdict:
        llr = self.llr(failures, trials)
        if llr >= math.log((1 - self.beta) / self.alpha):
            return "reject"
        if llr <= math.log(self.beta / (1 - self.alpha)):
            return "accept"
        return "continue"

    def failures_to_reject(self) -> int:
        """How many failures in a row reject, from the start."""
        bound = math.log((1 - self.beta) / self.alpha)
        return math.ceil(bound / math.log(self.p1 / self.p0))


def agreement_test(policy: RolloutPolicy, task_floor: float) -> Sprt:
    floor = policy.min_agreement or task_floor
    p0 = max(1.0 - floor, 1e-3)
    p1 = min(p0 + policy.agreement_margin, 0.999)
    return Sprt(p0, p1, policy.false_rollback, policy.false_rollback)


def latency_test(policy: RolloutPolicy) -> Sprt:
    return Sprt(SLOWER_OK, SLOWER_BAD, policy.false_rollback, policy.false_rollback)


def analyse_shadow(
    policy: RolloutPolicy,
    shadow: ShadowCounters,
    task_floor: float,
    champion_error_rate: float,
) -> Decision:
    """What the shadow stage's evidence says: rollback, advance (to the first weighted
    step) or wait."""
    from infergate.control.policy import Decision

    agreement, latency = agreement_test(policy, task_floor), latency_test(policy)
    figures = {
        "shadow_requests": float(shadow.requests),
        "shadow_texts": float(shadow.texts),
        "shadow_agreement": shadow.agreement,
        "shadow_largest_change": shadow.largest_change,
        "shadow_errors": float(shadow.errors),
        "shadow_slower": float(shadow.slower),
        "shadow_dropped": float(shadow.dropped),
        "agreement_llr": agreement.llr(shadow.disagreement, shadow.texts),
        "latency_llr": latency.llr(shadow.slower, shadow.requests),
    }
    said = f"{shadow.texts} texts, {shadow.requests} requests mirrored"
    error_rate = shadow.errors / shadow.requests if shadow.requests else 0.0
    if shadow.requests >= 10 and error_rate - champion_error_rate > policy.max_error_rate_increase:
        return Decision(
            "rollback",
            f"in shadow: fails {error_rate:.0%} of mirrored requests (champion "
            f"{champion_error_rate:.0%}; {said})",
            figures,
        )
    on_agreement = agreement.verdict(shadow.disagreement, shadow.texts)
    if on_agreement == "reject":
        return Decision(
            "rollback",
            f"in shadow: agrees with the champion on {shadow.agreement:.0%} of texts "
            f"(floor {1 - agreement.p0:.0%}; sequential test decided after {said})",
            figures,
        )
    on_latency = latency.verdict(shadow.slower, shadow.requests)
    if on_latency == "reject":
        return Decision(
            "rollback",
            f"in shadow: slower than the champion on {shadow.slower} of {shadow.requests} "
            "mirrored requests (sequential test)",
            figures,
        )
    if on_agreement == "accept" and on_latency == "accept" and shadow.texts >= policy.min_pairs:
        first = policy.steps[0]
        return Decision(
            "advance",
            f"shadow passed: agreement {shadow.agreement:.1%} over {said}; next {first}%",
            figures,
        )
    return Decision("wait", f"in shadow: {said}, no decision yet", figures)
