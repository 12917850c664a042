"""Canary rollouts against the registry: aliases ``champion`` and ``canary`` say what is
served, ``infergate.rollout.*`` tags on the registered model say where a rollout stands.

Anyone with an MLflow client can move the aliases; ``Rollouts.desired`` turns whatever
the registry says into the traffic table, starting a rollout for a canary alias it has
not seen. ``Rollouts.tick`` runs the automatic analysis. Every decision is logged with
its figures and counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from infergate import tasks
from infergate.control.policy import (
    TAG_PREFIX,
    Decision,
    Mode,
    RolloutPolicy,
    RolloutState,
    analyse,
    apply,
    check_weight,
    start,
)
from infergate.control.report import REPORT_TAG, report_text
from infergate.control.shadow import analyse_shadow
from infergate.control.windows import StepWindows
from infergate.errors import InvalidInput, RolloutConflict
from infergate.observe.counters import VersionCounters
from infergate.registry import RegisteredModel, Registry
from infergate.versions import CANARY, CHAMPION, ServedVersion, Shadow

log = logging.getLogger(__name__)
AUTO_CANARY_TAG = "infergate.auto_canary"
LAST_ROLLOUT_TAG = "infergate.last_rollout"
STATE_KEYS = [TAG_PREFIX + k for k in RolloutState.__dataclass_fields__]
# How a rollout ended, by action: the version's time and reason tags, the summary's verb.
_END_TAGS = {
    "promote": ("infergate.promoted_at", "infergate.promoted_reason", "promoted"),
    "rollback": ("infergate.rolled_back_at", "infergate.rollback_reason", "rolled back"),
}

Stats = Callable[[], dict[str, VersionCounters]]


@dataclass(frozen=True)
class Status:
    model: str
    task: str
    champion: str | None
    state: RolloutState | None
    policy: RolloutPolicy
    analysis: Decision | None  # this process's latest: fresher than the state's tags
    last_rollout: str | None = None

    def to_dict(self) -> dict[str, Any]:
        state, analysis = self.state, self.analysis
        decision: str | None = None
        reason: str | None = None
        if analysis is not None:
            decision, reason = analysis.action, analysis.reason
        elif state is not None:
            decision, reason = state.last_decision, state.last_reason
        return {
            "model": self.model,
            "task": self.task,
            "champion": self.champion,
            "canary": state.canary_version if state else None,
            "mode": state.mode if state else None,
            "weight": state.weight if state else 0,
            "step": state.step if state else None,
            "shadow": state.shadow if state else False,
            "steps": list(self.policy.steps),
            "last_decision": decision,
            "last_reason": reason,
            "figures": analysis.figures if analysis else {},
            "last_rollout": self.last_rollout,
        }


class Rollouts:
    def __init__(
        self,
        registry: Registry,
        stats: Stats,
        *,
        clock: Callable[[], float] = time.time,
        on_decision: Callable[[str, str], None] | None = None,
        windows: StepWindows | None = None,
    ) -> None:
        """``windows`` keeps what each step has seen (in a file: across restarts)."""
        self.registry = registry
        self.stats = stats
        self.clock = clock
        self.on_decision = on_decision or (lambda model, action: None)
        self._sources: dict[tuple[str, int, str], str] = {}
        self.windows = windows or StepWindows()
        # The latest analysis per model: every tick, while the tags change only with the
        # action (a write to MLflow every 2 s would be too many).
        self._analysis: dict[str, Decision] = {}
        self._bad_policies: set[tuple[str, str]] = set()
        # Per model, the decisions of the rollout running (since this process started).
        self._trails: dict[str, list[dict[str, Any]]] = {}

    # -- what to serve ------------------------------------------------------------------

    def desired(self) -> list[ServedVersion]:
        """Champion and canary of every model, with weights; starts unseen canaries.

        Both stay served while a rollout runs, even at weight 0: a champion the canary
        has all the traffic of is still there to roll back to at once, and either can be
        asked for by ``x-model-version``."""
        served: list[ServedVersion] = []
        for model in self.registry.models():
            state = self._sync_state(model)
            champion = model.aliases.get(CHAMPION)
            canary_weight = state.weight if state else 0
            if champion is not None:
                served.append(self._served(model, champion, CHAMPION, 100 - canary_weight))
            if state is not None:
                canary = self._served(model, state.canary_version, CANARY, canary_weight)
                if state.shadow:
                    policy = self._policy(model)
                    shadow = Shadow(
                        policy.shadow_share, policy.max_latency_ratio, policy.latency_margin_ms
                    )
                    canary = replace(canary, shadow=shadow)
                served.append(canary)
        return served

    def _served(
        self, model: RegisteredModel, version: str, role: str, weight: int
    ) -> ServedVersion:
        # A version's artifacts never change; a model registered again is another model.
        key = (model.name, model.created, version)
        if key not in self._sources:
            self._sources[key] = self.registry.version_source(model.name, version)
        return ServedVersion(model.name, version, model.task, self._sources[key], role, weight)

    def _ended_in_registry(self, model: RegisteredModel, state: RolloutState) -> None:
        """Record a rollout someone ended by moving aliases in MLflow, as the commands
        record theirs: the champion alias moved onto the canary, or the canary alias gone."""
        if model.aliases.get(CHAMPION) == state.canary_version:
            decision = Decision("promote", "the champion alias was moved to it in the registry")
        else:
            decision = Decision("rollback", "the canary alias was removed in the registry")
        self._record_end(model.name, state.canary_version, decision)

    def _record_end(self, name: str, version: str, decision: Decision) -> None:
        """Tags on the version and the model saying how a rollout ended, and the log."""
        at, why, verb = _END_TAGS[decision.action]
        now = str(int(self.clock()))
        self.registry.set_version_tags(name, version, {at: now, why: decision.reason})
        summary = f"version {version} {verb}: {decision.reason}"
        self.registry.set_model_tags(name, {LAST_ROLLOUT_TAG: summary})
        last = self._analysis.pop(name, None)
        self.windows.champions.pop(name, None)
        if last is not None and not decision.figures:  # ended by hand: the figures so far
            decision = replace(decision, figures=last.figures)
        self._log(name, decision)
        report = report_text(self._trails.pop(name, []))
        self.registry.set_version_tags(name, version, {REPORT_TAG: report})

    def _sync_state(self, model: RegisteredModel) -> RolloutState | None:
        """Bring the rollout tags in line with the aliases someone may have moved."""
        state = RolloutState.from_tags(model.tags)
        canary = model.aliases.get(CANARY) if _rolling_out(model) else None
        if canary is None:
            if state is not None:
                self._ended_in_registry(model, state)
                self.registry.delete_model_tags(model.name, STATE_KEYS)
            return None
        if state is None or state.canary_version != canary:
            state = start(canary, self._policy(model), self.clock())
            self.registry.set_model_tags(model.name, state.to_tags())
            self._log(model.name, Decision("start", f"canary alias on version {canary}"))
        return state

    # -- commands -----------------------------------------------------------------------

    def start(
        self,
        name: str,
        version: str,
        *,
        weight: int | None,
        mode: Mode,
        strict: bool = True,
        shadow: bool = True,
    ) -> Status:
        """Make ``version`` the canary; an automatic rollout without a weight begins in
        shadow unless ``shadow`` is False. ``strict``: refuse a policy tag that cannot be
        read (a user's command) rather than fall back to the defaults (a webhook's)."""
        model = self.registry.model(name)
        task = self.registry.version_task(name, version)  # raises for an unknown version
        if task and task != model.task:
            raise InvalidInput(
                f"version {version} of {name!r} is a {task} model; {name!r} serves {model.task}"
            )
        current = self._sync_state(model)
        if current is not None:
            raise RolloutConflict(
                f"version {current.canary_version} of {name!r} is already a canary; "
                "promote it or roll it back first"
            )
        if model.aliases.get(CHAMPION) == version:
            raise RolloutConflict(f"version {version} is already the champion of {name!r}")
        try:
            policy = RolloutPolicy.from_tags(model.tags) if strict else self._policy(model)
            state = start(version, policy, self.clock(), mode=mode, weight=weight, shadow=shadow)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        self.registry.set_model_tags(name, state.to_tags())
        self.registry.set_alias(name, CANARY, version)
        self._analysis.pop(name, None)  # the last rollout's
        self._log(name, Decision("start", state.last_reason))
        return self.status(name)

    def set_weight(self, name: str, weight: int) -> Status:
        _check(weight)
        _, state = self._running(name)
        state = RolloutState(
            state.canary_version, "manual", weight, -1, self.clock(), "set-weight",
            f"weight set to {weight} by hand",
        )  # fmt: skip
        self._analysis.pop(name, None)  # it speaks of the weight before
        self.registry.set_model_tags(name, state.to_tags())
        self._log(name, Decision("hold", state.last_reason))
        return self.status(name)

    def promote(self, name: str, reason: str = "promoted by hand") -> Status:
        model, state = self._running(name)
        old = model.aliases.get(CHAMPION)
        # The record first: whoever sees the aliases move also finds why.
        self._record_end(name, state.canary_version, Decision("promote", reason))
        if old is not None:
            self.registry.set_version_tags(
                name, old, {"infergate.replaced_by": state.canary_version}
            )
        self.registry.set_alias(name, CHAMPION, state.canary_version)
        self.registry.delete_alias(name, CANARY)
        self.registry.delete_model_tags(name, STATE_KEYS)
        return self.status(name)

    def rollback(self, name: str, reason: str = "rolled back by hand") -> Status:
        _, state = self._running(name)
        # The record first: whoever sees the alias gone also finds why.
        self._record_end(name, state.canary_version, Decision("rollback", reason))
        self.registry.delete_alias(name, CANARY)
        self.registry.delete_model_tags(name, STATE_KEYS)
        return self.status(name)

    def status(self, name: str) -> Status:
        # The aliases as they are now, also those the control loop has not seen yet (one
        # just set with an MLflow client), so a status or command never contradicts MLflow.
        state = self._sync_state(self.registry.model(name))
        model = self.registry.model(name)  # with the tags the sync may have written
        return Status(
            name,
            model.task,
            model.aliases.get(CHAMPION),
            state,
            self._policy(model),
            self._analysis.get(name) if state else None,
            model.tags.get(LAST_ROLLOUT_TAG),
        )

    def _running(self, name: str) -> tuple[RegisteredModel, RolloutState]:
        model = self.registry.model(name)
        state = self._sync_state(model)
        if state is None:
            raise RolloutConflict(f"no canary is rolling out for {name!r}")
        return model, state

    # -- automatic analysis -------------------------------------------------------------

    def tick(self) -> list[tuple[str, Decision]]:
        """One analysis round over every running rollout; returns the decisions taken."""
        decisions = []
        counters = self.stats()
        running: set[tuple[str, str, float]] = set()
        for model in self.registry.models():
            state = RolloutState.from_tags(model.tags)
            champion = model.aliases.get(CHAMPION)
            if state is None or not _rolling_out(model) or champion is None:
                continue
            policy = self._policy(model)
            step = (model.name, state.canary_version, state.step_started_at)
            running.add(step)
            window = self.windows.advance(step, counters)
            canary = window.get(f"{model.name}/{state.canary_version}", VersionCounters())
            stable = window.get(f"{model.name}/{champion}", VersionCounters()).window()
            # With all traffic on the canary the champion gets none to compare with: its
            # latest window that had enough stands in (from the step before, 50 % by default).
            rollout = (model.created, state.canary_version, champion)
            if stable.requests >= policy.min_requests:
                self.windows.champions[model.name] = (rollout, stable)
            taken_in, kept = self.windows.champions.get(model.name, (None, stable))
            earlier = (
                state.weight >= 100
                and stable.requests < policy.min_requests
                and taken_in == rollout
            )
            if earlier:
                stable = kept
            if state.shadow:
                floor = tasks.get(model.task).shadow_agreement
                decision = analyse_shadow(policy, canary.shadow, floor, stable.error_rate)
            else:
                decision = analyse(policy, state, canary.window(), stable, self.clock())
            if earlier and decision.action != "promote":  # said of comparisons only
                decision = replace(
                    decision, reason=f"{decision.reason} (champion: an earlier step's figures)"
                )
            if decision.action != "advance":  # an advance's figures are of a step now gone
                self._analysis[model.name] = decision
            if decision.action == "promote":
                self.promote(model.name, decision.reason)
            elif decision.action == "rollback":
                self.rollback(model.name, decision.reason)
            elif decision.action == "advance":
                self._analysis.pop(model.name, None)
                new_state = apply(policy, state, decision, self.clock())
                self.registry.set_model_tags(model.name, new_state.to_tags())
                self._log(model.name, decision)
            elif decision.action != state.last_decision:
                new_state = apply(policy, state, decision, state.step_started_at)
                self.registry.set_model_tags(model.name, new_state.to_tags())
            if decision.action in ("promote", "rollback", "advance"):
                decisions.append((model.name, decision))
        self.windows.keep_only(running)
        self.windows.save()
        return decisions

    def on_version_created(self, name: str, version: str) -> None:
        """A new version of a model asking for automatic canaries becomes the canary."""
        model = self.registry.model(name)
        if model.tags.get(AUTO_CANARY_TAG, "").lower() != "true":
            return
        if CHAMPION not in model.aliases or _rolling_out(model):
            why = "it has no champion" if CHAMPION not in model.aliases else "a rollout runs"
            log.info("version %s of %s is not made the canary: %s", version, name, why)
            return
        self.start(name, version, weight=None, mode="auto", strict=False)

    def _policy(self, model: RegisteredModel) -> RolloutPolicy:
        """The model's policy; the defaults when a tag cannot be read, so that one model's
        typo stops neither its own rollout nor anyone else's (``start`` refuses it)."""
        try:
            return RolloutPolicy.from_tags(model.tags)
        except ValueError as exc:
            if (model.name, str(exc)) not in self._bad_policies:  # said once, not every tick
                self._bad_policies.add((model.name, str(exc)))
                log.error("model %s: %s; its rollouts use the default policy", model.name, exc)
            return RolloutPolicy()

    def shadow_tests(self) -> dict[str, dict[str, float]]:
        """Per model in shadow, where its sequential tests stand (log-likelihood ratios)."""
        return {
            model: {"agreement": d.figures["agreement_llr"], "latency": d.figures["latency_llr"]}
            for model, d in self._analysis.items()
            if "agreement_llr" in d.figures
        }

    def _log(self, model: str, decision: Decision) -> None:
        entry = {"at": round(self.clock(), 3), "action": decision.action,
                 "reason": decision.reason, "figures": decision.figures}  # fmt: skip
        if decision.action == "start":  # a trail per rollout
            self._trails[model] = []
        self._trails.setdefault(model, []).append(entry)
        figures = " ".join(f"{k}={v:.4g}" for k, v in decision.figures.items())
        log.info("rollout %s: %s (%s) %s", model, decision.action, decision.reason, figures)
        self.on_decision(model, decision.action)


def _rolling_out(model: RegisteredModel) -> bool:
    """Whether a canary alias names a version other than the champion. One left on the
    champion (promoted by moving the champion alias in MLflow) is no rollout: it must not
    block the next one."""
    canary = model.aliases.get(CANARY)
    return canary is not None and canary != model.aliases.get(CHAMPION)


def _check(weight: int) -> None:
    try:
        check_weight(weight)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
