"""A front-end replica's routing state: table switches, versions it cannot load yet,
retries and draining. Built as it is, without Ray (``infergate.serve_app`` hosts it)."""

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import pytest

from fakes import FakeTritonBackend
from infergate.config import FrontendSettings, PayloadSettings
from infergate.errors import BackendUnavailable, ModelNotFound
from infergate.observe.telemetry import NullTelemetry
from infergate.serving import replica as replica_module
from infergate.serving.replica import Replica
from infergate.versions import CANARY, CHAMPION, ServedVersion, Shadow


def test_a_replaced_triton_channel_is_closed_once_its_batcher_is_idle(monkeypatch):
    monkeypatch.setattr(replica_module, "CLOSE_POLL_S", 0.01)

    async def scenario() -> tuple[bool, bool, Replica]:
        replica = Replica(NullTelemetry(), connect=FakeTritonBackend)
        replica.configure(FrontendSettings(triton_grpc_url="127.0.0.1:1"))
        replaced, batcher = replica.backend.backend.default, replica.backend
        replica.configure(FrontendSettings(triton_grpc_url="127.0.0.1:2"))
        batcher._tasks.add(asyncio.get_running_loop().create_future())  # a call still out
        await asyncio.sleep(0.05)
        while_busy = replaced.closed  # calls still out finish on it
        batcher._tasks.clear()
        await asyncio.sleep(0.05)
        return while_busy, replaced.closed, replica

    while_busy, closed, replica = asyncio.run(scenario())
    assert (while_busy, closed) == (False, True)
    assert replica.backend.backend.url == "127.0.0.1:2"
    assert not replica.backend.backend.default.closed
    assert replica._closing == set()


class Runtime:
    """What ``_apply`` and ``Frontend`` read of a loaded version."""

    def __init__(self, served: ServedVersion) -> None:
        self.served = served
        self.triton_model = served.triton_model
        self.spec = SimpleNamespace(task=served.task)
        self.in_flight = 0

    def with_served(self, served: ServedVersion) -> "Runtime":
        return Runtime(served)


def replica_with_table(tmp_path, broken: set[str]):
    """A replica whose loads of the versions in ``broken`` (read at each load) fail."""
    loads: list[str] = []

    def load(served: ServedVersion, registry, cache_dir) -> Runtime:
        loads.append(f"{served.name} v{served.version}")
        if served.version in broken:
            raise OSError("the artifact store did not answer")
        return Runtime(served)

    replica = Replica(NullTelemetry(), connect=FakeTritonBackend, load=load)
    replica.configure(FrontendSettings(artifact_cache_dir=tmp_path))
    return replica, loads


def test_a_version_a_replica_cannot_load_leaves_the_rest_of_its_table_serving(
    monkeypatch, tmp_path
):
    broken = {"2", "7", "8"}
    replica, loads = replica_with_table(tmp_path, broken)
    table = [
        ServedVersion("a", "1", "text-classification", "src/a1", CHAMPION, 90),
        ServedVersion("a", "2", "text-classification", "src/a2", CANARY, 10),
        ServedVersion("b", "7", "text-classification", "src/b7"),
        ServedVersion("c", "3", "text-classification", "src/c3"),
        ServedVersion("d", "8", "text-classification", "src/d8", CHAMPION, 90),
        ServedVersion("d", "9", "text-classification", "src/d9", CANARY, 10),
    ]
    replica.apply(table, 5)
    frontend = replica.frontend
    assert replica.table_version == 5
    assert {n: [r.served.version for r in m.versions] for n, m in frontend.models.items()} == {
        "a": ["1"],
        "c": ["3"],
    }  # a's canary share goes to its champion: pick() draws by the weights present
    with pytest.raises(BackendUnavailable, match="'b' is still loading"):
        frontend.path.model("b")
    # Its canary alone would take all of d's traffic on this replica.
    with pytest.raises(BackendUnavailable, match="'d' is still loading"):
        frontend.path.model("d")
    with pytest.raises(ModelNotFound):
        frontend.path.model("nope")
    # Tried again later (the store answers by then); loaded versions are not loaded again.
    assert replica.unloadable == {("a", "2"), ("b", "7"), ("d", "8")}
    assert frontend.missing == ("a v2", "b v7", "d v8")  # /readyz names them
    broken.clear()
    del loads[:]
    asyncio.run(replica.retry_unloadable())
    assert sorted(loads) == ["a v2", "b v7", "d v8"] and replica.unloadable == set()
    assert sorted(replica.frontend.models) == ["a", "b", "c", "d"]
    assert replica.frontend.missing == ()
    # Only a version whose files changed (registered again) is loaded anew.
    del loads[:]
    again = ServedVersion("c", "3", "text-classification", "src/c3-registered-again")
    replica.apply([*table[:3], again], 6)
    assert loads == ["c v3"]


def test_a_version_being_reloaded_answers_nothing_until_its_new_files_arrive(monkeypatch, tmp_path):
    """While Triton reloads a version registered again from other files, nothing of what
    the replica loaded of its first files may answer: a reloading canary's share goes to
    its champion, a model whose champion reloads answers 503, and the first files'
    runtime is let go (drained before the table counts as adopted)."""
    replica, loads = replica_with_table(tmp_path, broken=set())
    table = [
        ServedVersion("a", "1", "text-classification", "src/a1", CHAMPION, 90),
        ServedVersion("a", "2", "text-classification", "src/a2", CANARY, 10),
        ServedVersion("b", "1", "text-classification", "src/b1"),
    ]
    replica.apply(table, 1)
    del loads[:]
    reloading = [table[0], replace(table[1], reloading=True), replace(table[2], reloading=True)]
    replica.apply(reloading, 2)
    assert loads == []  # neither the first files nor anything else is loaded for them
    assert [r.served.version for r in replica.frontend.models["a"].versions] == ["1"]
    with pytest.raises(BackendUnavailable, match="'b' is still loading"):
        replica.frontend.path.model("b")
    assert set(replica.loaded) == {("a", "1")} and replica.frontend.missing == ()
    again = [table[0], replace(table[1], source="src/a2-again"), replace(table[2], source="b")]
    replica.apply(again, 3)
    assert sorted(loads) == ["a v2", "b v1"]
    assert replica.frontend.models["a"].versions[1].served.source == "src/a2-again"


def adoption_while_busy(replica, table: list[ServedVersion], busy) -> tuple[int, int]:
    """Pull ``table`` while ``busy`` (something with ``in_flight`` of 1) has a request
    under way; the replica's adopted table version then, and once the request is done."""

    installed = replica.table_version + 1

    async def scenario() -> tuple[int, int]:
        entries = [v.to_dict() for v in table]
        pulling = asyncio.create_task(replica.switch_table(installed, entries))
        while replica.table_version != installed:  # the new table is installed ...
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.02)  # ... and the request still under way
        while_busy = replica.adopted
        busy.in_flight = 0
        await pulling
        return while_busy, replica.adopted

    return asyncio.run(scenario())


def test_a_table_with_a_reloading_version_is_adopted_once_its_requests_are_done(
    monkeypatch, tmp_path
):
    replica, _ = replica_with_table(tmp_path, broken=set())
    first = ServedVersion("a", "1", "text-classification", "src/a1")
    replica.apply([first], 1)
    replica.table_version, replica.adopted = 1, 1
    runtime = replica.loaded[("a", "1")]
    runtime.in_flight = 1  # a request still waits for Triton
    reloading = replace(first, reloading=True)
    assert adoption_while_busy(replica, [reloading], runtime) == (1, 2)


def test_a_table_is_adopted_once_the_previous_front_ends_requests_are_done(monkeypatch, tmp_path):
    """A request that entered the previous front-end and is still reading its body has
    picked no version yet; it will pick one of the previous table's, which Triton may
    unload (or reload) once the new table counts as adopted."""
    replica, _ = replica_with_table(tmp_path, broken=set())
    first = ServedVersion("a", "1", "text-classification", "src/a1")
    replica.apply([first], 1)
    replica.table_version, replica.adopted = 1, 1
    previous = replica.frontend
    previous.in_flight = 1  # a request reading its body
    second = ServedVersion("a", "2", "text-classification", "src/a2")
    assert adoption_while_busy(replica, [second], previous) == (1, 2)
    assert replica.frontend is not previous


def test_table_entries_carry_the_reloading_and_shadow_marks_only_when_set():
    """Replicas of a release before the marks, still running during an upgrade, rebuild
    entries with ServedVersion(**entry): every ordinary table must stay readable so."""
    served = ServedVersion("a", "1", "text-classification", "src/a1", CANARY, 10)
    assert set(served.to_dict()) == {"name", "version", "task", "source", "role", "weight"}
    assert ServedVersion(**served.to_dict()) == served
    marked = replace(served, reloading=True)
    shadowed = replace(served, weight=0, shadow=Shadow(0.25, 2.0, 10.0))
    for entry in (served, marked, shadowed):
        assert ServedVersion.from_dict(entry.to_dict()) == entry


def test_a_retry_that_ends_after_a_new_table_arrived_changes_nothing(monkeypatch, tmp_path):
    replica, _ = replica_with_table(tmp_path, broken={"2"})
    first = [ServedVersion("a", "2", "text-classification", "src/a2")]
    replica.apply(first, 1)
    second = [ServedVersion("a", "3", "text-classification", "src/a3")]

    async def scenario() -> None:
        retry = asyncio.create_task(replica.retry_unloadable())
        await asyncio.sleep(0)  # the retry is loading, off the lock
        async with replica.applying:
            replica.apply(second, 2)
        await retry

    asyncio.run(scenario())
    assert replica.table_version == 2
    assert [r.served.version for r in replica.frontend.models["a"].versions] == ["3"]


def test_the_payload_log_outlives_tables_and_is_replaced_with_its_settings(tmp_path):
    replica, _ = replica_with_table(tmp_path, broken=set())
    assert not replica.payloads.enabled  # off unless configured
    on = PayloadSettings(enabled=True, url=str(tmp_path / "payloads"), flush_interval_s=60)
    replica.configure(FrontendSettings(artifact_cache_dir=tmp_path, payloads=on))
    first = replica.payloads
    replica.apply([ServedVersion("a", "1", "text-classification", "src/a1")], 2)
    assert first.enabled and replica.mirror.payloads is first
    assert replica.frontend.path.payloads is first  # a new table, the same log
    replica.configure(FrontendSettings(artifact_cache_dir=tmp_path, payloads=on))
    assert replica.payloads is first  # settings unchanged: the log goes on
    off = FrontendSettings(artifact_cache_dir=tmp_path)
    replica.configure(off)
    assert not replica.payloads.enabled and replica.frontend.path.payloads is replica.payloads
    first.close(timeout_s=5)  # already closed by the switch: its thread has ended
    assert first._thread is not None and not first._thread.is_alive()


def test_load_on_demand_follows_the_settings_and_the_warmer_outlives_tables(tmp_path):
    async def warm(model: str, timeout_s: float) -> tuple[str | None, list[str]]:
        return None, []

    replica = Replica(
        NullTelemetry(), connect=FakeTritonBackend, load=lambda v, *_: Runtime(v), warm=warm
    )
    replica.configure(FrontendSettings(artifact_cache_dir=tmp_path))
    assert not replica.warmer.enabled  # no budget: nothing is ever asked
    on = FrontendSettings(artifact_cache_dir=tmp_path, load_on_demand=True)
    replica.configure(on)
    warmer = replica.warmer
    assert warmer.enabled and warmer.timeout_s == on.cold_start_timeout_s
    replica.apply([ServedVersion("a", "1", "text-classification", "src/a1")], 2)
    assert replica.frontend.path.warmer is warmer  # a new table, the same warmer
    replica.configure(on)
    assert replica.warmer is warmer  # settings unchanged
    # Its report: the versions used since the last one, and those with requests in flight.
    warmer.use("a__v1")
    replica.loaded[("a", "1")].in_flight = 2
    assert replica.activity() == {"a__v1": 2}
    replica.loaded[("a", "1")].in_flight = 0
    assert replica.activity() == {}
