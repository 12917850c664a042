"""Canary rollouts: the policy, the state, and the analysis that moves a rollout along.

Pure: no Ray, Triton or MLflow. Time comes in as an argument, so the state machine is
tested with a fake clock. The state is small and string-serialisable because it lives
as tags on the registered model: a restart resumes a rollout where it was.

    start --> shadow --> step 0 (weight steps[0]) --> ... --> last step --> promote
                |             |                                  |
                +-------------+------------ rollback <-----------+   (first failed check)

An automatic rollout begins in shadow (``infergate.control.shadow``): weight 0, a share
of the champion's requests mirrored to it and compared. One started at a weight of its
own, or with the shadow turned off, goes on from the first step above that weight; a
manual one holds wherever it is put.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from statistics import NormalDist
from typing import Literal

import numpy as np

from infergate.observe.counters import VersionWindow
from infergate.observe.drift import psi

Mode = Literal["auto", "manual"]
Action = Literal["start", "wait", "advance", "promote", "rollback", "hold"]
TAG_PREFIX = "infergate.rollout."
SLOWER_Z = 2.33  # one-sided, about 1 % of windows of equally fast versions


@dataclass(frozen=True)
class RolloutPolicy:
    """How a canary is rolled out; defaults overridable per model by registry tags."""

    steps: tuple[int, ...] = (10, 25, 50, 100)
    step_interval_s: float = 30.0
    min_requests: int = 30  # per version and step, before anything is judged
    max_error_rate_increase: float = 0.02  # canary minus champion, absolute
    max_latency_ratio: float = 1.5  # canary p95 / champion p95
    max_output_psi: float = 0.25  # predicted classes, or embedding norms
    # A canary p95 at most this much above the champion's is never a failure: with a few
    # dozen requests a side, a p95 of milliseconds swings past any ratio by chance.
    latency_margin_ms: float = 5.0
    # The shadow stage (infergate.control.shadow): the share of the champion's requests
    # mirrored to the canary (0: no shadow stage); texts compared before it may pass; the
    # share of texts it must agree on (0: the task's own floor, Task.shadow_agreement) and
    # how much less makes a bad one; both sequential tests' error rates.
    shadow_share: float = 0.25
    min_pairs: int = 30
    min_agreement: float = 0.0
    agreement_margin: float = 0.25
    false_rollback: float = 0.01

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> RolloutPolicy:
        """Read ``infergate.rollout.policy.<field>`` tags; the rest keep their defaults."""
        prefix = TAG_PREFIX + "policy."
        values: dict[str, object] = {}
        for name, default in asdict(cls()).items():
            raw = tags.get(prefix + name)
            if raw is None:
                continue
            try:
                if isinstance(default, tuple):
                    values[name] = tuple(int(x) for x in raw.split(","))
                else:
                    values[name] = type(default)(raw)
            except ValueError:
                kinds = {tuple: "comma-separated integers", int: "an integer"}
                expected = kinds.get(type(default), "a number")
                raise ValueError(f"tag {prefix + name}={raw!r} is not {expected}") from None
        policy = cls(**values)  # type: ignore[arg-type]
        policy.validate()
        return policy

    def validate(self) -> None:
        if not self.steps or any(not 0 < s <= 100 for s in self.steps):
            raise ValueError(f"rollout steps must be within 1..100, got {self.steps}")
        if list(self.steps) != sorted(self.steps):
            raise ValueError(f"rollout steps must increase, got {self.steps}")
        for name in ("shadow_share", "min_agreement"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be within 0..1, got {getattr(self, name)}")
        if not 0 < self.false_rollback < 0.5:
            raise ValueError(f"false_rollback must be within 0..0.5, got {self.false_rollback}")
        if not 0 < self.agreement_margin < 1:
            raise ValueError(f"agreement_margin must be within 0..1, got {self.agreement_margin}")


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    figures: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutState:
    """A running rollout, as kept in ``infergate.rollout.*`` tags."""

    canary_version: str
    mode: Mode
    weight: int
    step: int  # index into policy.steps; -1 for a weight set by hand
    step_started_at: float  # wall-clock seconds
    last_decision: str = ""
    last_reason: str = ""
    shadow: bool = False  # weight 0, mirrored requests compared (infergate.control.shadow)

    def to_tags(self) -> dict[str, str]:
        return {TAG_PREFIX + k: str(v) for k, v in asdict(self).items()}

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> RolloutState | None:
        values = {k[len(TAG_PREFIX) :]: v for k, v in tags.items() if k.startswith(TAG_PREFIX)}
        if "canary_version" not in values:
            return None
        return cls(
            canary_version=values["canary_version"],
            mode="manual" if values.get("mode") == "manual" else "auto",
            weight=int(values.get("weight", 0)),
            step=int(values.get("step", 0)),
            step_started_at=float(values.get("step_started_at", 0.0)),
            last_decision=values.get("last_decision", ""),
            last_reason=values.get("last_reason", ""),
            shadow=values.get("shadow") == "True",
        )


def start(version: str, policy: RolloutPolicy, now: float, *, mode: Mode = "auto",
          weight: int | None = None, shadow: bool = True) -> RolloutState:  # fmt: skip
    """A new rollout: at ``weight`` when one is given; else an automatic one in shadow
    (unless ``shadow`` is False or the policy mirrors nothing), or at the first step."""
    if weight is None and mode == "auto" and shadow and policy.shadow_share > 0:
        why = f"shadow: {policy.shadow_share:.0%} of the champion's requests mirrored"
        return RolloutState(version, mode, 0, -1, now, "start", why, shadow=True)
    if weight is not None:
        check_weight(weight)
        if mode == "auto" and weight == 0:
            raise ValueError("an automatic rollout needs a weight above 0 to analyse anything")
        return RolloutState(version, mode, weight, -1, now, "start", f"weight set to {weight}")
    first = policy.steps[0]
    return RolloutState(version, mode, first, 0, now, "start", f"first step, weight {first}")


def next_step(policy: RolloutPolicy, state: RolloutState) -> int | None:
    """Index of the first step above the canary's weight; None once none is left."""
    return next((i for i, weight in enumerate(policy.steps) if weight > state.weight), None)


def check_weight(weight: int) -> None:
    if not 0 <= weight <= 100:
        raise ValueError(f"weight must be within 0..100, got {weight}")


def analyse(
    policy: RolloutPolicy,
    state: RolloutState,
    canary: VersionWindow,
    champion: VersionWindow,
    now: float,
) -> Decision:
    """Compare canary with champion over the current step and say what to do next."""
    figures = {
        "canary_requests": float(canary.requests),
        "champion_requests": float(champion.requests),
        "canary_error_rate": canary.error_rate,
        "champion_error_rate": champion.error_rate,
        "canary_p95_ms": canary.p95_ms,
        "champion_p95_ms": champion.p95_ms,
    }
    # Failures of the canary count even before the minimum sample: a broken version
    # should not keep its traffic for a whole step.
    if canary.requests >= 10 and canary.error_rate > 0.5:
        return Decision("rollback", f"canary fails {canary.error_rate:.0%} of requests", figures)
    if state.mode == "manual":
        return Decision("hold", f"manual mode, holding at weight {state.weight}", figures)
    if canary.requests < policy.min_requests:
        reason = f"waiting for traffic: {canary.requests}/{policy.min_requests} canary requests"
        return Decision("wait", reason, figures)
    error_increase = canary.error_rate - champion.error_rate
    if error_increase > policy.max_error_rate_increase:
        return Decision(
            "rollback",
            f"error rate {canary.error_rate:.1%} vs champion {champion.error_rate:.1%} "
            f"(allowed +{policy.max_error_rate_increase:.1%})",
            figures,
        )
    canary, incomparable = _in_champion_order(canary, champion)
    if incomparable is not None:  # no chance in this: said at once
        return Decision(
            "rollback", f"{incomparable}; roll it out by hand (canary start --manual)", figures
        )
    # Latency and outputs are statistics of samples: judged at every tick at the step's
    # own bounds, chance alone would fail an equal version sooner or later. They are
    # judged so once, over the whole step; before its end only evidence that also passes
    # a significance test strict enough for every look of the step rolls a canary back.
    too_slow = _latency_failure(policy, canary, champion, figures)
    diverging = _output_failure(policy, canary, champion, figures)
    if now - state.step_started_at < policy.step_interval_s:
        early = _early_failure(policy, canary, champion, figures)
        if early is not None:
            return Decision("rollback", early, figures)
        left = policy.step_interval_s - (now - state.step_started_at)
        return Decision("wait", f"step judged in {left:.0f} s", figures)
    failure = too_slow or diverging
    if failure is not None:
        return Decision("rollback", failure, figures)
    step = next_step(policy, state)
    if step is None:
        return Decision("promote", "every step passed", figures)
    return Decision("advance", f"{state.weight}% passed; next {policy.steps[step]}%", figures)


def _latency_failure(
    policy: RolloutPolicy, canary: VersionWindow, champion: VersionWindow, figures: dict
) -> str | None:
    """Why the canary is too slow, or None. All three must hold: its p95 above the
    champion's by more than the margin and the ratio, and its requests slower as a whole
    (a rank test; a p95 of a few dozen requests moves a lot by chance)."""
    if champion.requests < policy.min_requests:
        return None
    ratio = canary.p95_ms / max(champion.p95_ms, 1e-9)
    z = slower_z(canary.latency_counts, champion.latency_counts)
    figures.update(p95_ratio=ratio, slower_z=z)
    if (
        canary.p95_ms - champion.p95_ms > policy.latency_margin_ms
        and ratio > policy.max_latency_ratio
        and z > SLOWER_Z
    ):
        return (
            f"p95 latency {canary.p95_ms:.1f} ms is {ratio:.2f}x the champion's "
            f"(allowed {policy.max_latency_ratio:.2f}x), slower overall (z {z:.1f})"
        )
    return None


def _in_champion_order(
    canary: VersionWindow, champion: VersionWindow
) -> tuple[VersionWindow, str | None]:
    """The canary's window with its class shares in the order of the champion's classes
    (a retrained model may number them otherwise), or why the two cannot be compared."""
    if not canary.output_shares or not champion.output_shares:
        return canary, None
    ours, theirs = canary.classes, champion.classes
    if ours and theirs:
        if sorted(ours) != sorted(theirs):
            return canary, (
                f"its classes ({', '.join(ours)}) are not the champion's ({', '.join(theirs)})"
            )
        shares = dict(zip(ours, canary.output_shares, strict=True))
        return replace(canary, output_shares=tuple(shares[c] for c in theirs), classes=theirs), None
    if len(canary.output_shares) != len(champion.output_shares):
        return canary, (
            f"its outputs cannot be compared with the champion's ({len(canary.output_shares)} "
            f"classes against {len(champion.output_shares)})"
        )
    return canary, None


def _output_failure(
    policy: RolloutPolicy, canary: VersionWindow, champion: VersionWindow, figures: dict
) -> str | None:
    """Why the canary's outputs differ too much from the champion's, or None."""
    if not canary.output_shares or not champion.output_shares:
        return None
    divergence = psi(champion.output_shares, canary.output_shares)
    figures["output_psi"] = divergence
    if champion.requests >= policy.min_requests and divergence > policy.max_output_psi:
        return (
            f"output distribution diverges from the champion's: PSI {divergence:.3f} "
            f"(allowed {policy.max_output_psi})"
        )
    return None


def look_level(policy: RolloutPolicy) -> float:
    """The significance level of one look before a step's end. Rollouts are analysed
    every few seconds (``admin.analysis_interval_s``); counting a look a second, the
    step's looks together fail an equal version in at most ``false_rollback`` of steps
    (Bonferroni: looks at growing windows overlap, so the real rate is lower)."""
    return policy.false_rollback / max(1.0, policy.step_interval_s)


def _early_failure(
    policy: RolloutPolicy, canary: VersionWindow, champion: VersionWindow, figures: dict
) -> str | None:
    """Why the canary is rolled back before its step ends, or None: a failure of the
    step's own bounds (``_latency_failure``, ``_output_failure``, already in
    ``figures``) that is also significant at ``look_level``."""
    if champion.requests < policy.min_requests:
        return None
    level = look_level(policy)
    z_bound = NormalDist().inv_cdf(1.0 - level)
    if (
        figures.get("slower_z", 0.0) > z_bound
        and canary.p95_ms - champion.p95_ms > policy.latency_margin_ms
        and figures.get("p95_ratio", 0.0) > policy.max_latency_ratio
    ):
        return (
            f"p95 latency {canary.p95_ms:.1f} ms is {figures['p95_ratio']:.2f}x the "
            f"champion's, slower overall (z {figures['slower_z']:.1f} > {z_bound:.1f}), "
            "before the step's end"
        )
    if figures.get("output_psi", 0.0) > policy.max_output_psi:
        chi2, df = shares_chi2(canary.output_shares, canary.requests,
                               champion.output_shares, champion.requests)  # fmt: skip
        bound = chi2_bound(level, df)
        figures.update(output_chi2=chi2, output_chi2_bound=bound)
        if chi2 > bound:
            return (
                f"output distribution diverges from the champion's: PSI "
                f"{figures['output_psi']:.3f} (allowed {policy.max_output_psi}), chi-square "
                f"{chi2:.1f} > {bound:.1f}, before the step's end"
            )
    return None


def shares_chi2(
    canary: Sequence[float], n_canary: int, champion: Sequence[float], n_champion: int
) -> tuple[float, int]:
    """Chi-square of homogeneity of two versions' output shares over their requests, and
    its degrees of freedom. A request adds shares summing to 1 however many texts it
    holds, so requests of many texts make the statistic smaller (the test conservative)."""
    a, b = np.asarray(canary, dtype=float), np.asarray(champion, dtype=float)
    pooled = (n_canary * a + n_champion * b) / (n_canary + n_champion)
    seen = pooled > 0
    weight = n_canary * n_champion / (n_canary + n_champion)
    chi2 = weight * float(np.sum((a - b)[seen] ** 2 / pooled[seen]))
    return chi2, max(int(seen.sum()) - 1, 1)


def chi2_bound(level: float, df: int) -> float:
    """The chi-square value ``df`` degrees of freedom exceed with probability ``level``:
    exact for one and two, else Wilson and Hilferty's cube-root approximation (within
    1 % from three degrees on)."""
    if df == 1:
        return NormalDist().inv_cdf(1.0 - level / 2) ** 2
    if df == 2:
        return -2.0 * math.log(level)
    z = NormalDist().inv_cdf(1.0 - level)
    return df * (1.0 - 2.0 / (9 * df) + z * math.sqrt(2.0 / (9 * df))) ** 3


def slower_z(canary: Sequence[int], champion: Sequence[int]) -> float:
    """Mann-Whitney z of "canary requests take longer than the champion's", from latency
    histograms over the same buckets (two requests in one bucket count as a tie). Equally
    fast versions exceed ``SLOWER_Z`` in about 1 % of windows; 0.0 without data."""
    a, b = np.asarray(canary, dtype=float), np.asarray(champion, dtype=float)
    n1, n2 = a.sum(), b.sum()
    if a.shape != b.shape or not n1 or not n2:
        return 0.0
    faster_champion = np.cumsum(b) - b  # champion requests in lower buckets
    u = float(np.sum(a * (faster_champion + 0.5 * b)))
    ties = a + b
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - float(np.sum(ties**3 - ties)) / (n * (n - 1)))
    return (u - n1 * n2 / 2) / np.sqrt(variance) if variance > 0 else 0.0


def apply(
    policy: RolloutPolicy, state: RolloutState, decision: Decision, now: float
) -> RolloutState:
    """The state after ``decision``; promote and rollback end the rollout (the caller
    moves the aliases and clears the state)."""
    step = next_step(policy, state)
    if decision.action == "advance" and step is not None:
        return replace(
            state,
            step=step,
            weight=policy.steps[step],
            step_started_at=now,
            last_decision="advance",
            last_reason=decision.reason,
            shadow=False,
        )
    return replace(state, last_decision=decision.action, last_reason=decision.reason)
