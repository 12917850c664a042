"""Pieces of the front-end deployment that need no running Ray."""

import asyncio
from types import SimpleNamespace

import pytest

from infergate import serve_app
from infergate.config import FrontendSettings
from infergate.errors import BackendUnavailable, ModelNotFound
from infergate.monitor import Monitors
from infergate.registry import CANARY, CHAMPION, ServedVersion
from infergate.serve_app import FrontendDeployment
from infergate.telemetry import NullTelemetry


class Backend:
    timeout_s = 0.05

    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def test_a_replaced_triton_channel_is_closed_once_its_calls_can_be_over():
    replica = object.__new__(FrontendDeployment.func_or_class)
    replica._closing = set()
    replaced = Backend()

    async def scenario() -> tuple[bool, bool]:
        replica._close_later(replaced)
        await asyncio.sleep(0.01)
        early = replaced.closed  # a call still out may finish on it
        await asyncio.sleep(0.1)
        return early, replaced.closed

    assert asyncio.run(scenario()) == (False, True)
    assert replica._closing == set()


class Runtime:
    """What ``_apply`` and ``Frontend`` read of a loaded version."""

    def __init__(self, served: ServedVersion) -> None:
        self.served = served
        self.spec = SimpleNamespace(task=served.task)

    def with_served(self, served: ServedVersion) -> "Runtime":
        return Runtime(served)


def replica_with_table(monkeypatch, tmp_path, broken: set[str]):
    """A replica object (no Ray) whose loads of the versions in ``broken`` (read at each
    load) fail."""
    loads: list[str] = []

    def load(served: ServedVersion, registry, cache_dir) -> Runtime:
        loads.append(f"{served.name} v{served.version}")
        if served.version in broken:
            raise OSError("the artifact store did not answer")
        return Runtime(served)

    monkeypatch.setattr(serve_app.ModelRuntime, "load", staticmethod(load))
    replica = object.__new__(FrontendDeployment.func_or_class)
    replica._settings = FrontendSettings(artifact_cache_dir=tmp_path)
    replica._backend = object()
    replica._loaded = {}
    replica._telemetry = NullTelemetry()
    replica._monitors = Monitors(replica._telemetry)
    return replica, loads


def test_a_version_a_replica_cannot_load_leaves_the_rest_of_its_table_serving(
    monkeypatch, tmp_path
):
    broken = {"2", "7"}
    replica, loads = replica_with_table(monkeypatch, tmp_path, broken)
    table = [
        ServedVersion("a", "1", "text-classification", "src/a1", CHAMPION, 90),
        ServedVersion("a", "2", "text-classification", "src/a2", CANARY, 10),
        ServedVersion("b", "7", "text-classification", "src/b7"),
        ServedVersion("c", "3", "text-classification", "src/c3"),
    ]
    replica._apply(table, 5)
    frontend = replica._frontend
    assert replica._table_version == 5
    assert {n: [r.served.version for r in m.versions] for n, m in frontend.models.items()} == {
        "a": ["1"],
        "c": ["3"],
    }  # a's canary share goes to its champion: pick() draws by the weights present
    with pytest.raises(BackendUnavailable, match="'b' is still loading"):
        frontend._model("b")
    with pytest.raises(ModelNotFound):
        frontend._model("nope")
    # Tried again later (the store answers by then); loaded versions are not loaded again.
    assert replica._unloadable == {("a", "2"), ("b", "7")}
    broken.clear()
    del loads[:]
    replica._apply(replica._served, replica._table_version)
    assert sorted(loads) == ["a v2", "b v7"] and replica._unloadable == set()
    assert sorted(replica._frontend.models) == ["a", "b", "c"]
    # Only a version whose files changed (registered again) is loaded anew.
    del loads[:]
    again = ServedVersion("c", "3", "text-classification", "src/c3-registered-again")
    replica._apply([*table[:3], again], 6)
    assert loads == ["c v3"]
