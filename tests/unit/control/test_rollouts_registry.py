"""Rollouts against a registry held in memory: what one model's state does to the others,
and when a new version becomes the canary by itself.

The same commands against the real MLflow registry and stack: tests/e2e/test_canary.py.
"""

import numpy as np
import pytest

from fakes import FakeClock, MemoryRegistry
from infergate.control.rollouts import AUTO_CANARY_TAG, Rollouts
from infergate.control.windows import StepWindows
from infergate.errors import InvalidInput, RolloutConflict
from infergate.observe.counters import VersionCounters
from infergate.registry import RegisteredModel
from infergate.versions import CANARY, CHAMPION

NO_SHADOW = {"infergate.rollout.policy.shadow_share": "0"}  # weighted steps from the start


def registered(name: str, tags: dict[str, str] | None = None, **aliases: str) -> RegisteredModel:
    return RegisteredModel(name, "text-classification", dict(aliases), dict(tags or {}))


def test_a_policy_tag_that_cannot_be_read_stops_no_rollout():
    typo = {"infergate.rollout.policy.min_requests": "12.0"}
    registry = MemoryRegistry(
        registered("a", typo, champion="1", canary="2"),
        registered("b", champion="1", canary="2"),
        registered("c", typo, champion="1"),
    )
    rollouts = Rollouts(registry, stats=dict, clock=FakeClock())
    served = {(v.name, v.version): v.weight for v in rollouts.desired()}
    # Canaries in shadow: served at weight 0, their champions keep every request.
    assert served == {("a", "1"): 100, ("a", "2"): 0, ("b", "1"): 100, ("b", "2"): 0,
                      ("c", "1"): 100}  # fmt: skip
    assert rollouts.tick() == []  # analysed (waiting for traffic), not stopped
    assert rollouts.status("a").policy.min_requests == 30  # the default, not the tag's 12
    with pytest.raises(InvalidInput, match=r"min_requests='12\.0' is not an integer"):
        rollouts.start("c", "2", weight=None, mode="auto")
    registry.set_model_tags("c", {AUTO_CANARY_TAG: "true"})
    rollouts.on_version_created("c", "3")  # a webhook: nobody to tell, so the defaults
    assert registry.model("c").aliases == {CHAMPION: "1", CANARY: "3"}


def test_an_automatic_start_at_weight_0_is_refused():
    registry = MemoryRegistry(registered("a", champion="1"))
    rollouts = Rollouts(registry, stats=dict)
    with pytest.raises(InvalidInput, match="above 0"):
        rollouts.start("a", "2", weight=0, mode="auto")
    assert rollouts.start("a", "2", weight=0, mode="manual").state.weight == 0


@pytest.mark.parametrize(
    ("aliases", "becomes_canary"),
    [({CHAMPION: "1"}, True), ({CHAMPION: "1", CANARY: "1"}, True),
     ({CHAMPION: "1", CANARY: "2"}, False), ({}, False)],
)  # fmt: skip
def test_a_new_version_of_an_auto_canary_model(aliases, becomes_canary):
    # A canary alias left on the champion (it was promoted by moving the champion alias
    # in MLflow) is no rollout in progress.
    model = registered("a", {AUTO_CANARY_TAG: "true"}, **aliases)
    rollouts = Rollouts(MemoryRegistry(model), stats=dict)
    rollouts.on_version_created("a", "3")
    assert (model.aliases.get(CANARY) == "3") is becomes_canary


def test_status_shows_the_latest_analysis_and_a_new_rollout_none_of_the_last():
    registry = MemoryRegistry(registered("a", NO_SHADOW, champion="1", canary="2"))
    counters: dict[str, VersionCounters] = {}
    rollouts = Rollouts(registry, stats=lambda: dict(counters), clock=FakeClock())
    rollouts.desired()
    rollouts.tick()
    assert rollouts.status("a").to_dict()["last_reason"].startswith("waiting for traffic")
    counters.update({"a/2": VersionCounters(requests=40), "a/1": VersionCounters(requests=300)})
    rollouts.tick()  # still "wait", so the tags keep the first reason
    shown = rollouts.status("a").to_dict()
    assert shown["last_reason"] == "step judged in 30 s"
    assert shown["figures"]["canary_requests"] == 40
    assert registry.model("a").tags["infergate.rollout.last_reason"].startswith("waiting")
    rollouts.rollback("a")
    assert rollouts.start("a", "3", weight=None, mode="auto").to_dict()["figures"] == {}


@pytest.mark.parametrize(("weight", "champion_weight"), [(100, 0), (0, 100), (40, 60)])
def test_both_versions_stay_served_whatever_the_canary_weight(weight, champion_weight):
    registry = MemoryRegistry(registered("a", champion="1"))
    rollouts = Rollouts(registry, stats=dict)
    rollouts.start("a", "2", weight=weight, mode="manual")
    served = {(v.version, v.role): v.weight for v in rollouts.desired()}
    assert served == {("1", CHAMPION): champion_weight, ("2", CANARY): weight}


def test_a_canary_alias_left_on_the_champion_is_no_rollout():
    # Promoted by moving the champion alias in MLflow; the state tags are still there.
    model = registered("a", champion="2", canary="2")
    registry = MemoryRegistry(model)
    rollouts = Rollouts(registry, stats=dict, clock=FakeClock())
    rollouts.start("a", "3", weight=None, mode="auto")  # the state tags of a rollout of 3
    registry.set_alias("a", CHAMPION, "3")
    assert rollouts.status("a").state is None and rollouts.tick() == []
    rollouts.start("a", "4", weight=None, mode="auto")  # no conflict with the stale tags
    assert model.aliases == {CHAMPION: "3", CANARY: "4"}


@pytest.mark.parametrize(
    ("move", "summary", "tag"),
    [("remove canary", "version 2 rolled back: the canary alias was removed in the registry",
      "infergate.rollback_reason"),
     ("move champion", "version 2 promoted: the champion alias was moved to it in the registry",
      "infergate.promoted_reason")],
)  # fmt: skip
def test_a_rollout_ended_in_mlflow_is_recorded_like_one_ended_by_command(move, summary, tag):
    model = registered("a", champion="1")
    registry = MemoryRegistry(model)
    rollouts = Rollouts(registry, stats=dict, clock=FakeClock())
    rollouts.start("a", "2", weight=None, mode="auto")
    if move == "remove canary":
        registry.delete_alias("a", CANARY)
    else:
        registry.set_alias("a", CHAMPION, "2")
    rollouts.desired()
    assert model.tags["infergate.last_rollout"] == summary
    assert tag in registry.version_tags[("a", "2")]
    assert not any(key.startswith("infergate.rollout.") for key in model.tags)
    rollouts.desired()  # recorded once
    assert rollouts.status("a").to_dict()["last_rollout"] == summary


def test_a_canary_alias_just_set_in_mlflow_is_seen_by_status_and_commands():
    """Set with an MLflow client before the control loop has read it: `canary status` shows
    the rollout and the commands act on it (they said there was no canary)."""
    model = registered("a", champion="1")
    registry = MemoryRegistry(model)
    rollouts = Rollouts(registry, stats=dict, clock=FakeClock())
    registry.set_alias("a", CANARY, "2")
    shown = rollouts.status("a").to_dict()
    assert (shown["canary"], shown["weight"], shown["mode"], shown["shadow"]) == (
        "2",
        0,
        "auto",
        True,
    )
    assert shown["last_decision"] == "start"
    assert shown["last_reason"] == "shadow: 25% of the champion's requests mirrored"
    with pytest.raises(RolloutConflict, match="version 2 of 'a' is already a canary"):
        rollouts.start("a", "3", weight=None, mode="auto")
    promoted = rollouts.promote("a").to_dict()
    assert (promoted["champion"], promoted["canary"]) == ("2", None)
    assert model.tags["infergate.last_rollout"] == "version 2 promoted: promoted by hand"
    registry.delete_alias("a", CANARY)
    with pytest.raises(RolloutConflict, match="no canary is rolling out for 'a'"):
        rollouts.rollback("a")


def test_set_weight_shows_the_new_weight_at_once():
    registry = MemoryRegistry(registered("a", champion="1"))
    counters = {"a/2": VersionCounters(requests=40), "a/1": VersionCounters(requests=300)}
    rollouts = Rollouts(registry, stats=lambda: dict(counters), clock=FakeClock())
    rollouts.start("a", "2", weight=50, mode="manual")
    rollouts.tick()
    assert rollouts.status("a").to_dict()["last_reason"] == "manual mode, holding at weight 50"
    shown = rollouts.set_weight("a", 30).to_dict()
    assert (shown["weight"], shown["last_reason"]) == (30, "weight set to 30 by hand")


def test_a_model_deleted_and_registered_again_is_served_from_its_new_files():
    registry = MemoryRegistry(registered("a", champion="1"))
    rollouts = Rollouts(registry, stats=dict)
    assert [v.source for v in rollouts.desired()] == ["runs:/run-1/a/1"]
    again = RegisteredModel("a", "text-classification", {CHAMPION: "1"}, {}, created=2)
    registry.register_again(again, run="run-2")  # version 1 again, other files
    assert [v.source for v in rollouts.desired()] == ["runs:/run-2/a/1"]


def served_for(counters: VersionCounters, milliseconds: float, n: int) -> VersionCounters:
    """``counters`` with ``n`` more requests of about ``milliseconds`` each, class 0."""
    more = VersionCounters()
    for i in range(n):
        seconds = milliseconds * (0.8 + 0.4 * i / n) / 1e3
        more.add(200, seconds, np.array([[2.0, 0.0]]), ["a", "b"])
    return counters.merged(more)


def test_the_last_step_is_judged_against_the_champion_of_the_step_before():
    """At 100 % the champion gets no requests; a canary slow only there must not pass."""
    policy = {"infergate.rollout.policy.steps": "50,100",
              "infergate.rollout.policy.step_interval_s": "60"}  # fmt: skip
    registry = MemoryRegistry(registered("a", policy, champion="1"))
    clock = FakeClock()
    counters = {"a/1": VersionCounters(), "a/2": VersionCounters()}
    rollouts = Rollouts(registry, stats=lambda: dict(counters), clock=clock)
    rollouts.start("a", "2", weight=None, mode="auto", shadow=False)
    rollouts.tick()  # the step's window starts here
    counters["a/1"] = served_for(counters["a/1"], 10.0, 200)
    counters["a/2"] = served_for(counters["a/2"], 10.0, 200)
    clock.advance(61)
    assert [d.action for _, d in rollouts.tick()] == ["advance"]
    assert rollouts.status("a").state.weight == 100
    rollouts.tick()  # the 100 % step's window starts here
    counters["a/2"] = served_for(counters["a/2"], 40.0, 200)
    clock.advance(61)
    (decision,) = [d for _, d in rollouts.tick()]
    assert decision.action == "rollback" and "p95 latency" in decision.reason
    assert decision.figures["champion_requests"] == 200  # the 50 % step's
    assert decision.reason.endswith("(champion: an earlier step's figures)")


def test_an_earlier_window_stands_in_only_at_100_and_only_for_the_same_champion():
    policy = {"infergate.rollout.policy.steps": "25,50,100",
              "infergate.rollout.policy.step_interval_s": "60"}  # fmt: skip
    registry = MemoryRegistry(registered("a", policy, champion="1"))
    clock = FakeClock()
    counters = {key: VersionCounters() for key in ("a/1", "a/2", "a/3")}
    rollouts = Rollouts(registry, stats=lambda: dict(counters), clock=clock)
    rollouts.start("a", "2", weight=None, mode="auto", shadow=False)
    rollouts.tick()
    counters["a/1"] = served_for(counters["a/1"], 10.0, 200)
    counters["a/2"] = served_for(counters["a/2"], 10.0, 200)
    clock.advance(61)
    rollouts.tick()  # advance to 50 %
    rollouts.tick()  # the 50 % step's window starts here
    counters["a/2"] = served_for(counters["a/2"], 10.0, 40)
    rollouts.tick()
    fifty = rollouts.status("a").analysis
    assert rollouts.status("a").state.weight == 50
    assert fifty.figures["champion_requests"] == 0 and "earlier" not in fifty.reason
    # At 100 % with another champion (its alias moved meanwhile): nothing of v1's stands in.
    rollouts.set_weight("a", 100)
    registry.set_alias("a", CHAMPION, "3")
    rollouts.tick()
    counters["a/2"] = served_for(counters["a/2"], 10.0, 40)
    rollouts.tick()
    hundred = rollouts.status("a").analysis
    assert hundred.figures["champion_requests"] == 0 and "earlier" not in hundred.reason


def test_a_version_of_another_task_is_refused_as_the_canary():
    registry = MemoryRegistry(registered("a", champion="1"))
    registry.tasks[("a", "5")] = "feature-extraction"
    rollouts = Rollouts(registry, lambda: {})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="version 5 of 'a' is a feature-extraction model"):
        rollouts.start("a", "5", weight=None, mode="auto")
    assert CANARY not in registry.model("a").aliases
    rollouts.start("a", "6", weight=None, mode="auto")  # one of its own task
    assert registry.model("a").aliases[CANARY] == "6"


def test_a_control_plane_restarted_mid_rollout_goes_on_with_the_steps_figures(tmp_path):
    """The windows are in a file: a restarted Rollouts judges the 100 % step against the
    champion of the step before, and counts the canary's requests from before the restart;
    front-end replicas that restarted meanwhile (counters from zero) lose nothing either."""
    policy = {"infergate.rollout.policy.steps": "50,100",
              "infergate.rollout.policy.step_interval_s": "60"}  # fmt: skip
    registry = MemoryRegistry(registered("a", policy, champion="1"))
    clock = FakeClock()
    counters = {"a/1": VersionCounters(), "a/2": VersionCounters()}
    path = tmp_path / "rollout-windows.json"

    def control_plane() -> Rollouts:
        return Rollouts(registry, stats=lambda: dict(counters), clock=clock,
                        windows=StepWindows(path))  # fmt: skip

    rollouts = control_plane()
    rollouts.start("a", "2", weight=None, mode="auto", shadow=False)
    rollouts.tick()
    counters["a/1"] = served_for(counters["a/1"], 10.0, 200)
    counters["a/2"] = served_for(counters["a/2"], 10.0, 200)
    clock.advance(61)
    assert [d.action for _, d in rollouts.tick()] == ["advance"]
    rollouts.tick()  # the 100 % step's window starts here
    # Fewer than min_requests (30) before the restart: nothing judged yet, not even early.
    counters["a/2"] = served_for(counters["a/2"], 40.0, 20)
    assert rollouts.tick() == [] and rollouts.status("a").analysis.action == "wait"
    restarted = control_plane()  # the process is gone; the file stays
    counters = {"a/1": VersionCounters(), "a/2": served_for(VersionCounters(), 40.0, 20)}
    clock.advance(61)
    (decision,) = [d for _, d in restarted.tick()]
    assert decision.action == "rollback" and "p95 latency" in decision.reason
    assert decision.figures["champion_requests"] == 200  # the 50 % step's, kept
    assert decision.figures["canary_requests"] == 40  # 20 before the restart, 20 after
