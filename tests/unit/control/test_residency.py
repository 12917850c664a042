"""The budget of loaded versions: which version makes room, which idles out, and what is
never unloaded; then the control plane applying it, with Triton and the registry faked.

Loading real versions on demand into a real Triton is covered in
tests/e2e/test_many_models.py.
"""

import pytest
from test_reconcile import Plane, version

from infergate.control.residency import NoRoom, Placement, Residency, protected
from infergate.versions import CANARY, CHAMPION


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def filled(budget: int | None, *models: str, idle_unload_s: float | None = None):
    """A residency with ``models`` loaded one second apart, oldest first."""
    clock = Clock()
    residency = Residency(budget, idle_unload_s, clock)
    for model in models:
        residency.did_load(model)
        clock.now += 1
    return residency, clock


def test_the_least_recently_used_version_makes_room():
    residency, _clock = filled(3, "a", "b", "c")
    residency.used(["a"])  # now the most recent: b is the oldest
    assert residency.make_room("d", busy=set(), protected=set()) == ["b"]


def test_nothing_goes_while_there_is_room_or_for_a_loaded_version():
    residency, _ = filled(3, "a", "b")
    assert residency.make_room("c", busy=set(), protected=set()) == []
    residency.did_load("c")
    assert residency.make_room("a", busy=set(), protected=set()) == []


def test_without_a_budget_nothing_is_ever_unloaded_for_room():
    residency, _ = filled(None, *"abcdefgh")
    assert not residency.managed
    assert residency.make_room("z", busy=set(), protected=set()) == []
    assert residency.idle(busy=set(), protected=set()) == []


def test_busy_and_protected_versions_are_passed_over():
    residency, _ = filled(3, "a", "b", "c")
    assert residency.make_room("d", busy={"a"}, protected={"b"}) == ["c"]


def test_no_room_when_every_loaded_version_is_busy_or_protected():
    residency, _ = filled(2, "a", "b")
    with pytest.raises(NoRoom, match="budget 2") as raised:
        residency.make_room("c", busy={"a"}, protected={"b"})
    assert raised.value.status == 503


def test_a_lowered_budget_unloads_as_many_as_it_takes():
    residency, _ = filled(4, "a", "b", "c", "d")
    residency.budget = 2
    assert residency.make_room("e", busy=set(), protected=set()) == ["a", "b", "c"]


def test_reported_use_counts_as_use_unless_older_than_what_is_known():
    residency, _clock = filled(2, "a", "b")  # a at 1000, b at 1001; now 1002
    residency.seen({"a": 0.5})  # a replica used a half a second ago
    assert residency.make_room("c", busy=set(), protected=set()) == ["b"]
    residency.seen({"a": 100.0})  # an old report does not make a look older
    assert residency.last_used["a"] == pytest.approx(1001.5)


def test_versions_idle_for_the_setting_are_unloaded_oldest_first():
    residency, clock = filled(None, "a", "b", "c", idle_unload_s=60)
    clock.now = 1061.5  # a (1000) and b (1001) idle over 60 s, c (1002) not yet
    assert residency.idle(busy=set(), protected=set()) == ["a", "b"]
    assert residency.idle(busy={"a"}, protected={"b"}) == []
    residency.used(["a"])
    assert residency.idle(busy=set(), protected=set()) == ["b"]


def test_a_canary_and_its_champion_are_protected_other_models_not():
    served = [
        version("1", CHAMPION, 90),
        version("2", CANARY, 10),
        version("7", name="other"),
    ]
    assert protected(served) == {"m__v1", "m__v2"}


# -- the control plane applying it --------------------------------------------------------


def budgeted(tmp_path, budget: int, names: list[str]) -> tuple[Plane, Clock]:
    plane = Plane(tmp_path, [version("1", name=name) for name in names])
    clock = Clock()
    plane.residency = Placement(budget, None, clock)
    events: list[tuple[str, str]] = []
    plane.on_residency = lambda model, event, seconds: events.append((model, event))
    plane.events = events  # type: ignore[attr-defined]
    return plane, clock


def test_registering_more_versions_than_the_budget_keeps_triton_within_it(tmp_path):
    plane, _clock = budgeted(tmp_path, 2, ["a", "b", "c", "d"])
    result = plane.reconcile()
    # Every version was loaded once (judged loadable) and all are served ...
    assert sorted(result.loaded) == ["a__v1", "b__v1", "c__v1", "d__v1"]
    assert sorted(v.name for v in plane.tables[-1]) == ["a", "b", "c", "d"]
    # ... but Triton holds two, the last ones loaded.
    assert plane.triton.ready == {"c__v1", "d__v1"}
    assert plane.events == [("a__v1", "room"), ("b__v1", "room")]
    # A served version Triton does not hold is not "lacking": no reload behind our back.
    assert plane.lacking() == {}


def test_a_version_asked_for_is_loaded_in_place_of_the_least_recently_used(tmp_path):
    plane, clock = budgeted(tmp_path, 2, ["a", "b", "c"])
    plane.reconcile()  # b, c loaded
    clock.now += 5
    plane.note_usage({"b__v1": 0.0}, busy=set())  # c is the least recently used now
    assert plane.load_on_demand("a__v1") >= 0
    assert plane.triton.ready == {"a__v1", "b__v1"}
    assert plane.events[-2:] == [("c__v1", "room"), ("a__v1", "demand")]
    # Asked for again while loaded: nothing happens.
    assert plane.load_on_demand("a__v1") == 0.0
    assert plane.events[-1] == ("a__v1", "demand")


def test_a_version_with_requests_in_flight_is_never_the_one_to_go(tmp_path):
    plane, _clock = budgeted(tmp_path, 2, ["a", "b", "c"])
    plane.reconcile()  # b (older), c
    plane.note_usage({}, busy={"b__v1"})
    plane.load_on_demand("a__v1")
    assert plane.triton.ready == {"a__v1", "b__v1"}


def test_a_canary_under_analysis_and_its_champion_stay_loaded(tmp_path):
    plane, _clock = budgeted(tmp_path, 2, [])
    plane.wanted = [version("1", CHAMPION, 90), version("2", CANARY, 10)]
    plane.reconcile()
    plane.wanted = [*plane.wanted, version("1", name="x")]
    result = plane.reconcile()
    # No room for x: it waits (held back, not judged) rather than unloading the pair.
    assert "x__v1" in result.held_back and plane.triton.ready == {"m__v1", "m__v2"}
    assert plane.failures == []
    # The rollout over (the canary promoted): the pair stays protected until the replicas
    # run the table without the canary; x takes the old champion's place at the next check.
    plane.wanted = [version("2"), version("1", name="x")]
    assert "x__v1" in plane.reconcile().held_back
    plane.reconcile()
    assert plane.triton.ready == {"m__v2", "x__v1"}


def test_a_version_no_longer_served_is_not_loaded_on_demand(tmp_path):
    plane, _ = budgeted(tmp_path, 2, ["a"])
    plane.reconcile()
    with pytest.raises(Exception, match="not served"):
        plane.load_on_demand("gone__v3")


def test_idle_versions_are_unloaded_and_loaded_again_when_asked_for(tmp_path):
    plane, clock = budgeted(tmp_path, 5, ["a", "b"])
    plane.residency.idle_unload_s = 30
    plane.reconcile()
    clock.now += 31
    plane.note_usage({"b__v1": 1.0}, busy=set())
    assert plane.unload_idle() == ["a__v1"]
    assert plane.triton.ready == {"b__v1"}
    plane.load_on_demand("a__v1")
    assert plane.triton.ready == {"a__v1", "b__v1"}


def test_a_version_unloaded_while_a_reconcile_looked_is_not_loaded_back(tmp_path):
    plane, _ = budgeted(tmp_path, 2, ["a", "b"])
    plane.reconcile()
    # The check saw a missing from Triton while it was being unloaded for room; by the
    # time the reconcile may load, the residency says it is out: it stays out.
    plane.lacking = lambda: {"a__v1": ["10.0.0.1:8101"]}
    plane._unload("a__v1", "10.0.0.1:8101", "room")
    result = plane.reconcile()
    assert result.loaded == [] and plane.triton.ready == {"b__v1"}
