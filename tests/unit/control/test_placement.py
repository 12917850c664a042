"""Hot sets per Triton: with a budget, each Triton of a fleet holds versions of its own,
a version is loaded on one of them, and what makes room or idles out goes from that one
only; without a budget every Triton holds everything. Triton's control API and the
registry are faked (``FakePods``).

Two real Tritons in two network hosts, with the replicas' requests routed to the one
that holds each version: tests/e2e/test_two_tritons.py.
"""

from test_reconcile import version
from test_residency import Clock

from fakes import FakePods
from infergate.control.reconcile import ControlPlane
from infergate.control.residency import Placement
from infergate.versions import CANARY, CHAMPION, ServedVersion

A, B = "10.1.0.5:8101", "10.1.0.6:8101"


class Ticking(Clock):
    """A clock that moves on at every reading: loads one after another are ordered."""

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


class FleetPlane(ControlPlane):
    """A control plane over two fake Tritons; loads read no files."""

    def __init__(self, wanted: list[ServedVersion], budget: int | None) -> None:
        self.pods = FakePods("10.1.0.5", "10.1.0.6")
        self.wanted = wanted
        self.clock = Ticking()
        self.events: list[tuple[str, str]] = []
        super().__init__(
            registry=None,  # type: ignore[arg-type]
            fleet=self.pods.fleet(),
            cache_dir=None,  # type: ignore[arg-type]
            deploy=lambda served: None,
            desired=lambda: self.wanted,
            residency=Placement(budget, None, self.clock),
            on_residency=lambda model, event, seconds: self.events.append((model, event)),
        )

    def _load(self, version: ServedVersion, model: str, only: list[str] | None) -> None:
        tritons = self.fleet.endpoints()
        for url in tritons if only is None else only:
            tritons[url].load(model, 1.0)

    def ready(self) -> dict[str, set[str]]:
        return {url: set(t.ready) for url, t in sorted(self.pods.tritons.items())}


def names(*models: str) -> list[ServedVersion]:
    return [version("1", name=name) for name in models]


def test_without_a_budget_every_triton_holds_every_version_and_a_new_pod_gets_them():
    plane = FleetPlane(names("a", "b"), budget=None)
    plane.reconcile()
    assert plane.ready() == {A: {"a__v1", "b__v1"}, B: {"a__v1", "b__v1"}}
    plane.pods.addresses.append("10.1.0.7")
    plane.reconcile()
    assert plane.ready()["10.1.0.7:8101"] == {"a__v1", "b__v1"}


def test_with_a_budget_each_version_is_loaded_on_one_triton_the_emptiest():
    plane = FleetPlane(names("a", "b", "c"), budget=2)
    plane.reconcile()
    # a to A (both empty: the first), b to B (the emptier), c to A: all three hot, each
    # once, and neither Triton over its budget of two.
    assert plane.ready() == {A: {"a__v1", "c__v1"}, B: {"b__v1"}}
    assert plane.residency.loaded == {"a__v1": [A], "b__v1": [B], "c__v1": [A]}
    assert plane.events == []


def test_a_cold_version_takes_the_place_of_the_fleets_least_recently_used():
    plane = FleetPlane(names("a", "b", "c", "d"), budget=1)
    plane.reconcile()  # a to A, b to B, then c and d each made room: A holds c, B holds d
    assert plane.ready() == {A: {"c__v1"}, B: {"d__v1"}}
    plane.clock.now += 5
    plane.note_usage({"c__v1": 0.0}, busy=set())  # d (on B) is now the least recently used
    plane.load_on_demand("a__v1")
    assert plane.ready() == {A: {"c__v1"}, B: {"a__v1"}}
    assert plane.events[-2:] == [("d__v1", "room"), ("a__v1", "demand")]
    assert plane.pods.tritons[A].unloaded == ["a__v1"]  # from the reconcile, room for c
    # Hot on B and cold on A: asked for again, it is not loaded a second time.
    assert plane.load_on_demand("a__v1") == 0.0 and plane.residency.loaded["a__v1"] == [B]


def test_a_version_busy_on_one_triton_sends_the_load_to_the_other():
    plane = FleetPlane(names("a", "b"), budget=1)
    plane.reconcile()  # a on A, then b on B: a is the least recently used ...
    plane.note_usage({}, busy={"a__v1"})  # ... but has requests in flight: it stays
    plane.wanted = names("a", "b", "c")
    plane.reconcile()
    assert plane.residency.loaded == {"a__v1": [A], "c__v1": [B]}
    assert plane.events == [("b__v1", "room")]


def test_a_canary_and_its_champion_stay_loaded_wherever_they_are():
    plane = FleetPlane([version("1", CHAMPION, 90), version("2", CANARY, 10)], budget=1)
    plane.reconcile()  # one on each Triton
    assert plane.ready() == {A: {"m__v1"}, B: {"m__v2"}}
    plane.wanted = [*plane.wanted, *names("x")]
    assert "x__v1" in plane.reconcile().held_back  # no room on either: it waits
    assert plane.ready() == {A: {"m__v1"}, B: {"m__v2"}} and plane.events == []


def test_idle_versions_leave_the_triton_that_holds_them():
    plane = FleetPlane(names("a", "b"), budget=2)
    plane.residency.idle_unload_s = 30
    plane.reconcile()  # a on A, b on B
    plane.clock.now += 31
    plane.note_usage({"b__v1": 1.0}, busy=set())
    assert plane.unload_idle() == ["a__v1"]
    assert plane.ready() == {A: set(), B: {"b__v1"}}
    assert plane.pods.tritons[B].unloaded == []


def test_a_triton_that_restarted_empty_gets_its_own_versions_back_and_no_others():
    plane = FleetPlane(names("a", "b"), budget=2)
    plane.reconcile()
    plane.pods.tritons[B].ready.clear()  # B restarted, empty
    assert plane.lacking() == {"b__v1": [B]}
    plane.reconcile()
    assert plane.ready() == {A: {"a__v1"}, B: {"b__v1"}}


def test_a_triton_that_went_away_is_forgotten_and_its_versions_load_elsewhere():
    plane = FleetPlane(names("a", "b"), budget=2)
    plane.reconcile()
    plane.pods.addresses.remove("10.1.0.6")  # B's pod is gone, with b
    assert plane.lacking() == {} and plane.residency.loaded == {"a__v1": [A]}
    plane.load_on_demand("b__v1")
    assert plane.residency.loaded == {"a__v1": [A], "b__v1": [A]}


def test_a_triton_that_does_not_answer_is_passed_over_for_a_load():
    plane = FleetPlane(names("a"), budget=2)
    plane.fleet.endpoints()  # both pods known
    plane.pods.tritons[A].up = False
    plane.reconcile()
    assert plane.residency.loaded == {"a__v1": [B]}


def test_a_check_asks_each_triton_once_whether_it_answers():
    plane = FleetPlane(names("a", "b"), budget=2)
    plane.reconcile()  # a on A, b on B
    asked = {url: triton.asked for url, triton in plane.pods.tritons.items()}
    plane.pods.tritons[A].ready.clear()  # restarted empty
    assert plane.lacking() == {"a__v1": [A]}
    assert {url: t.asked - asked[url] for url, t in plane.pods.tritons.items()} == {A: 1, B: 1}


def test_a_version_registered_again_is_reloaded_where_it_is():
    plane = FleetPlane(names("a", "b"), budget=2)
    plane.reconcile()  # a on A, b on B
    plane.wanted = [ServedVersion("b", "1", "text-classification", "src/again")]
    plane.reconcile()
    assert (
        plane.residency.loaded == {"b__v1": [B]} and plane.pods.tritons[B].loaded == ["b__v1"] * 2
    )
    assert plane.pods.tritons[A].loaded == ["a__v1"]


def test_with_idle_unloads_alone_every_triton_holds_every_version_and_idles_it_out():
    plane = FleetPlane(names("a", "b"), budget=None)
    plane.residency.idle_unload_s = 30
    plane.reconcile()
    assert plane.ready() == {A: {"a__v1", "b__v1"}, B: {"a__v1", "b__v1"}}
    plane.clock.now += 31
    plane.note_usage({"b__v1": 1.0}, busy=set())
    assert plane.unload_idle() == ["a__v1", "a__v1"]  # from each Triton
    assert plane.ready() == {A: {"b__v1"}, B: {"b__v1"}}
    plane.load_on_demand("a__v1")
    assert plane.residency.loaded == {"a__v1": [A, B], "b__v1": [A, B]}
    plane.pods.addresses.append("10.1.0.7")  # a new pod gets what is loaded
    plane.reconcile()
    assert plane.ready()["10.1.0.7:8101"] == {"a__v1", "b__v1"}


def test_a_control_plane_that_restarted_takes_in_what_each_triton_holds_within_its_budget():
    plane = FleetPlane(names("a", "b", "c"), budget=2)
    plane.fleet.endpoints()
    # What a previous control plane left: A within its budget, B over it (a budget lowered).
    plane.pods.tritons[A].ready = {"a__v1"}
    plane.pods.tritons[B].ready = {"b__v1", "c__v1", "other__v9"}  # other: not ours
    plane.reconcile()
    assert plane.residency.loaded == {"a__v1": [A], "b__v1": [B], "c__v1": [B]}
    assert plane.pods.tritons[B].loaded == ["b__v1", "c__v1"]  # reloaded in place
    assert plane.pods.tritons[A].loaded == ["a__v1"] and plane.events == []
    # Over the budget: taken in up to it, the rest unloaded.
    plane = FleetPlane(names("a", "b", "c"), budget=1)
    plane.fleet.endpoints()
    plane.pods.tritons[B].ready = {"b__v1", "c__v1"}
    plane.reconcile()
    assert plane.pods.tritons[B].unloaded[0] == "c__v1"
    assert max(len(r) for r in plane.ready().values()) == 1


def test_a_version_whose_triton_does_not_answer_is_loaded_on_one_that_does():
    plane = FleetPlane(names("a", "b"), budget=2)
    plane.reconcile()  # a on A, b on B
    plane.pods.tritons[B].up = False
    plane.lacking()  # the check's look: B resolves, and does not answer
    assert plane.placement() == {"a__v1": [A], "b__v1": []}  # replicas are not sent there
    assert plane.load_on_demand("b__v1") > 0
    assert plane.placement() == {"a__v1": [A], "b__v1": [A]}
    # B is back, still holding b: both are recorded, each within its budget.
    plane.pods.tritons[B].up = True
    plane.lacking()
    assert plane.placement() == {"a__v1": [A], "b__v1": [A, B]}


def test_with_one_triton_the_replicas_are_given_no_address():
    plane = FleetPlane(names("a"), budget=2)
    plane.pods.addresses.remove("10.1.0.6")
    plane.reconcile()
    assert plane.residency.loaded == {"a__v1": [A]} and plane.placement() == {"a__v1": []}
