"""Canary rollouts: the policy, the state, and the analysis that moves a rollout along.

Pure: no Ray, Triton or MLflow. Time comes in as an argument, so the state machine is
tested with a fake clock. The state is small and string-serialisable because it lives
as tags on the registered model: a restart resumes a rollout where it was.

    start --> step 0 (weight steps[0]) --> ... --> last step --> promote
                 |                                    |
                 +----------- rollback <--------------+   (first failed check)

An automatic rollout started at a weight of its own goes on from the first step above
that weight; a manual one holds wherever it is put.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from infergate.drift import psi

Mode = Literal["auto", "manual"]
Action = Literal["start", "wait", "advance", "promote", "rollback", "hold"]
TAG_PREFIX = "infergate.rollout."


@dataclass(frozen=True)
class RolloutPolicy:
    """How a canary is rolled out; defaults overridable per model by registry tags."""

    steps: tuple[int, ...] = (10, 25, 50, 100)
    step_interval_s: float = 30.0
    min_requests: int = 30  # per version and step, before anything is judged
    max_error_rate_increase: float = 0.02  # canary minus champion, absolute
    max_latency_ratio: float = 1.5  # canary p95 / champion p95
    max_output_psi: float = 0.25  # predicted classes, or embedding norms
    latency_floor_ms: float = 5.0  # p95 below this on both sides is never a failure

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


@dataclass(frozen=True)
class VersionWindow:
    """What the front-end saw of one version since the current step began."""

    requests: int = 0
    errors: int = 0  # server-side failures (5xx) after the version was chosen
    p95_ms: float = 0.0
    output_shares: tuple[float, ...] = ()  # predicted classes, or binned embedding norms

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


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
        )


def start(version: str, policy: RolloutPolicy, now: float, *, mode: Mode = "auto",
          weight: int | None = None) -> RolloutState:  # fmt: skip
    """A new rollout at the first step, or at ``weight`` when one is given."""
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
    if champion.requests and max(canary.p95_ms, champion.p95_ms) > policy.latency_floor_ms:
        ratio = canary.p95_ms / max(champion.p95_ms, 1e-9)
        figures["p95_ratio"] = ratio
        if ratio > policy.max_latency_ratio:
            return Decision(
                "rollback",
                f"p95 latency {canary.p95_ms:.1f} ms is {ratio:.2f}x the champion's "
                f"(allowed {policy.max_latency_ratio:.2f}x)",
                figures,
            )
    if canary.output_shares and len(canary.output_shares) == len(champion.output_shares):
        divergence = psi(champion.output_shares, canary.output_shares)
        figures["output_psi"] = divergence
        if champion.requests >= policy.min_requests and divergence > policy.max_output_psi:
            return Decision(
                "rollback",
                f"output distribution diverges from the champion's: PSI {divergence:.3f} "
                f"(allowed {policy.max_output_psi})",
                figures,
            )
    if now - state.step_started_at < policy.step_interval_s:
        left = policy.step_interval_s - (now - state.step_started_at)
        return Decision("wait", f"checks pass; next step in {left:.0f} s", figures)
    step = next_step(policy, state)
    if step is None:
        return Decision("promote", "every step passed", figures)
    return Decision("advance", f"{state.weight}% passed; next {policy.steps[step]}%", figures)


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
        )
    return replace(state, last_decision=decision.action, last_reason=decision.reason)
