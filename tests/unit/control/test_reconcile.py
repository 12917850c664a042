"""The control plane's convergence rules, with Triton and the registry replaced by fakes:
what gets loaded, what traffic goes where, and what is unloaded when a load fails.

Loading real versions into a real Triton is covered in tests/e2e/test_stack.py.
"""

import errno
import json
import os
from types import SimpleNamespace

import pytest

from fakes import FakeTritonControl, MemoryRegistry
from infergate.config import TritonSettings
from infergate.control import reconcile
from infergate.control.reconcile import ControlPlane
from infergate.errors import BackendUnavailable, RegistrationError
from infergate.triton.fleet import TritonFleet
from infergate.versions import CANARY, CHAMPION, ServedVersion


def fleet_of(triton: FakeTritonControl, repository) -> TritonFleet:
    """One Triton at one address, reading ``repository``."""
    return TritonFleet(
        TritonSettings(), repository, connect=lambda url: triton, resolve=lambda host: ["10.0.0.1"]
    )


class Plane(ControlPlane):
    """Loads succeed except for the Triton models listed in ``broken``."""

    def __init__(self, tmp_path, desired: list[ServedVersion]) -> None:
        self.tables: list[list[ServedVersion]] = []
        self.failures: list[tuple[str, str]] = []
        self.broken: set[str] = set()
        self.wanted = desired
        self.triton = FakeTritonControl()
        super().__init__(
            registry=None,
            fleet=fleet_of(self.triton, tmp_path),
            cache_dir=tmp_path,
            deploy=self.tables.append,
            desired=lambda: self.wanted,
            on_load_failure=lambda v, reason: self.failures.append((v.version, v.role)),
        )

    def _load(self, version: ServedVersion, model: str, only: list[str] | None) -> None:
        if model in self.broken:
            raise RuntimeError(f"{model} is corrupt")
        if not self.triton.up:
            raise BackendUnavailable("Triton at 10.0.0.1:8001 is not reachable.")
        self.triton.ready.add(model)


def version(number: str, role: str = CHAMPION, weight: int = 100, name: str = "m") -> ServedVersion:
    return ServedVersion(name, number, "text-classification", f"src/{number}", role, weight)


def served(plane: Plane, name: str = "m") -> list[tuple[str, str, int]]:
    return [(v.version, v.role, v.weight) for v in plane.tables[-1] if v.name == name]


def test_a_new_champion_triton_cannot_load_leaves_the_old_one_serving(tmp_path):
    plane = Plane(tmp_path, [version("1")])
    plane.reconcile()
    plane.wanted, plane.broken = [version("3")], {"m__v3"}
    result = plane.reconcile()
    assert result.failed.keys() == {"m__v3"} and plane.failures == [("3", CHAMPION)]
    assert served(plane) == [("1", CHAMPION, 100)]
    assert plane.triton.unloaded == [] and result.unloaded == []
    # Fixed in the registry (or in Triton): the next reconcile moves on to it.
    plane.broken = set()
    plane.reconcile()
    assert served(plane) == [("3", CHAMPION, 100)] and plane.triton.unloaded == ["m__v1"]


def test_the_old_champion_keeps_the_champions_share_beside_a_canary(tmp_path):
    plane = Plane(tmp_path, [version("1")])
    plane.reconcile()
    plane.wanted = [version("3", weight=75), version("4", CANARY, 25)]
    plane.broken = {"m__v3"}
    plane.reconcile()
    assert served(plane) == [("1", CHAMPION, 75), ("4", CANARY, 25)]


def test_a_canary_triton_cannot_load_gets_no_traffic(tmp_path):
    plane = Plane(tmp_path, [version("1", weight=90), version("2", CANARY, 10)])
    plane.broken = {"m__v2"}
    plane.reconcile()
    assert served(plane) == [("1", CHAMPION, 100)]
    assert plane.failures == [("2", CANARY)]


def test_a_first_champion_that_fails_serves_nothing(tmp_path):
    plane = Plane(tmp_path, [version("1")])
    plane.broken = {"m__v1"}
    result = plane.reconcile()
    assert served(plane) == [] and result.failed.keys() == {"m__v1"}


class LoadRecorder(Plane):
    """Records loads and published tables in the order they happen."""

    def __init__(self, tmp_path, desired: list[ServedVersion]) -> None:
        self.loads: list[tuple[str, str]] = []
        self.events: list[tuple] = []
        super().__init__(tmp_path, desired)
        self.deploy = self._publish

    def _publish(self, table: list[ServedVersion]) -> None:
        self.tables.append(table)
        self.events.append(("table", [(v.version, v.weight, v.reloading) for v in table]))

    def _load(self, version: ServedVersion, model: str, only: list[str] | None) -> None:
        self.triton.ready.add(model)
        self.loads.append((model, version.source))
        self.events.append(("load", model, version.source))


def test_a_version_registered_again_under_its_name_and_number_is_loaded_again(tmp_path):
    """Deleting a registered model and registering it again restarts at version 1: the
    Triton model name is the same, the files are not."""
    plane = LoadRecorder(tmp_path, [version("1")])
    plane.reconcile()
    plane.reconcile()  # nothing changed: nothing loaded again
    assert plane.loads == [("m__v1", "src/1")]
    again = ServedVersion("m", "1", "text-classification", "src/other-run")
    plane.wanted = [again]
    result = plane.reconcile()
    assert plane.loads == [("m__v1", "src/1"), ("m__v1", "src/other-run")]
    assert result.loaded == ["m__v1"] and result.unloaded == []
    assert plane.tables[-1] == [again] and plane.serving["m__v1"] == again


def test_replicas_stop_using_a_version_before_triton_reloads_it_from_other_files(tmp_path):
    """Reloaded in place under the same Triton name, the new graph must never receive ids
    from the first files' tokenizer: a table marking that version as reloading is
    published (and ``deploy`` waits until every replica runs it) before the load."""
    plane = LoadRecorder(tmp_path, [version("1", weight=90), version("2", CANARY, 10)])
    plane.reconcile()
    plane.events.clear()
    again = ServedVersion("m", "2", "text-classification", "src/other-run", CANARY, 10)
    plane.wanted = [version("1", weight=90), again]
    plane.reconcile()
    assert plane.events == [
        ("table", [("1", 90, False), ("2", 10, True)]),
        ("load", "m__v2", "src/other-run"),
        ("table", [("1", 90, False), ("2", 10, False)]),
    ]
    assert plane.tables[-1][1].source == "src/other-run"
    plane.events.clear()
    plane.reconcile()  # settled: no table and no load
    assert plane.events == []


def test_a_version_whose_tokenizer_cannot_be_read_never_reaches_triton(tmp_path):
    """Replicas load the tokenizer, spec and drift reference; the control plane reads them
    first, so such a version fails like one Triton cannot load (canary rolled back, a new
    champion's traffic kept on the old one) instead of reaching the replicas' table."""
    files = tmp_path / "files"
    (files / "tokenizer").mkdir(parents=True)
    (files / "tokenizer" / "tokenizer.json").write_text("this is not a tokenizer")
    (files / "reference_stats.json").write_text("{}")
    spec = {"task": "text-classification", "labels": ["a", "b"], "output_name": "logits",
            "output_dim": 2, "max_length": 16}  # fmt: skip
    (files / "infergate.json").write_text(json.dumps(spec))
    triton = FakeTritonControl()
    failures: list[str] = []
    plane = ControlPlane(
        registry=MemoryRegistry(files=files),
        fleet=fleet_of(triton, tmp_path / "repository"),
        cache_dir=tmp_path / "cache",
        deploy=lambda table: None,
        desired=lambda: [version("1", CANARY, 10)],
        on_load_failure=lambda v, reason: failures.append(reason),
    )
    result = plane.reconcile()
    (reason,) = failures
    assert reason.startswith("its tokenizer, serving spec or drift reference cannot be read")
    assert result.failed == {"m__v1": reason} and result.served == []
    assert triton.loaded == [] and not (tmp_path / "repository" / "m__v1").exists()


def test_a_version_of_another_task_than_its_model_never_reaches_triton(tmp_path, monkeypatch):
    """An embedding model made the canary of a classifier would answer half its clients
    with vectors: it fails like a version Triton cannot load."""
    embedding = SimpleNamespace(spec=SimpleNamespace(task="feature-extraction"))
    monkeypatch.setattr(reconcile, "load_version", lambda *args: embedding)
    triton, failures = FakeTritonControl(), []
    plane = ControlPlane(
        registry=None,
        fleet=fleet_of(triton, tmp_path / "repository"),
        cache_dir=tmp_path / "cache",
        deploy=lambda table: None,
        desired=lambda: [version("5", CANARY, 10)],  # of a text-classification model
        on_load_failure=lambda v, reason: failures.append(reason),
    )
    result = plane.reconcile()
    assert failures == ["it is a feature-extraction model; m serves text-classification"]
    assert result.served == [] and triton.loaded == []


def test_after_triton_restarted_every_served_version_is_loaded_again(tmp_path):
    plane = Plane(tmp_path, [version("1", weight=90), version("2", CANARY, 10)])
    plane.reconcile()
    assert plane.reconcile().loaded == [] and plane.lacking() == {}  # nothing new
    plane.triton.ready.clear()  # it restarted, empty
    assert plane.lacking() == {"m__v1": ["10.0.0.1:8101"], "m__v2": ["10.0.0.1:8101"]}
    assert plane.reconcile().loaded == ["m__v1", "m__v2"]
    assert len(plane.tables) == 1  # the replicas' table did not change
    assert plane.reconcile().loaded == []


def test_a_served_version_a_triton_fails_to_take_back_stays_served(tmp_path):
    """A Triton that restarted empty, and could not be loaded again (a flapping pod, the
    registry away): the version keeps its place in the table and on the other Tritons,
    its canary is not rolled back, and the next reconcile tries again."""
    plane = Plane(tmp_path, [version("1", weight=90), version("2", CANARY, 10)])
    plane.reconcile()
    plane.triton.ready.clear()
    plane.broken = {"m__v2"}
    result = plane.reconcile()
    assert result.failed.keys() == {"m__v2"} and result.loaded == ["m__v1"]
    assert served(plane) == [("1", CHAMPION, 90), ("2", CANARY, 10)]
    assert plane.failures == [] and plane.triton.unloaded == [] and len(plane.tables) == 1
    plane.broken = set()
    assert plane.reconcile().loaded == ["m__v2"]


def test_a_canary_meeting_an_unreachable_triton_waits_rather_than_rolls_back(tmp_path):
    plane = Plane(tmp_path, [version("1")])
    plane.reconcile()
    plane.wanted = [version("1", weight=90), version("2", CANARY, 10)]
    plane.triton.up = False
    result = plane.reconcile()
    assert result.failed.keys() == {"m__v2"} and plane.failures == []  # not judged
    assert served(plane) == [("1", CHAMPION, 100)]
    plane.triton.up = True  # back: the next reconcile serves it
    plane.reconcile()
    assert served(plane) == [("1", CHAMPION, 90), ("2", CANARY, 10)]


class DiskFullPlane(Plane):
    """The artifact cache's disk is full while ``full``: reading a new version's files
    fails as ``Registry.download`` does then, wrapped by the control plane."""

    full = False

    chained = True  # False: as MLflow's download reports it, the OSError's text only

    def _load(self, version: ServedVersion, model: str, only: list[str] | None) -> None:
        if self.full:
            disk = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            if not self.chained:  # MLflow's MlflowException lists failures as text
                raise RegistrationError(f"cannot be read: MlflowException: failures: {disk}")
            raise RegistrationError(f"its tokenizer cannot be read: {disk}") from disk
        super()._load(version, model, only)


@pytest.mark.parametrize("chained", [True, False], ids=["chained", "as-text"])
def test_a_canary_meeting_a_full_artifact_cache_waits_rather_than_rolls_back(tmp_path, chained):
    """A full disk is the place's fault, not the version's: no rollback, and the version is
    tried again at every check (``held_back``) until the disk has room."""
    plane = DiskFullPlane(tmp_path, [version("1")])
    plane.chained = chained
    plane.reconcile()
    plane.wanted = [version("1", weight=90), version("2", CANARY, 10)]
    plane.full = True
    result = plane.reconcile()
    assert "No space left on device" in result.failed["m__v2"]
    assert plane.failures == [] and plane.held_back == {"m__v2"}
    assert served(plane) == [("1", CHAMPION, 100)]
    plane.full = False
    plane.reconcile()
    assert plane.held_back == set()
    assert served(plane) == [("1", CHAMPION, 90), ("2", CANARY, 10)]


def test_a_broken_canary_is_not_held_back(tmp_path):
    plane = Plane(tmp_path, [version("1")])
    plane.reconcile()
    plane.wanted = [version("1", weight=90), version("2", CANARY, 10)]
    plane.broken = {"m__v2"}
    plane.reconcile()
    assert plane.failures == [("2", CANARY)] and plane.held_back == set()
