"""Pieces of the front-end deployment that need no running Ray."""

import asyncio
import logging
import logging.handlers
from dataclasses import replace
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
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def test_a_replaced_triton_channel_is_closed_once_its_batcher_is_idle(monkeypatch):
    monkeypatch.setattr(serve_app, "CLOSE_POLL_S", 0.01)
    replica = object.__new__(FrontendDeployment.func_or_class)
    replica._closing = set()
    replaced, batcher = Backend(), SimpleNamespace(idle=False)

    async def scenario() -> tuple[bool, bool]:
        replica._close_later(batcher, replaced)
        await asyncio.sleep(0.05)
        while_busy = replaced.closed  # calls still out finish on it
        batcher.idle = True
        await asyncio.sleep(0.05)
        return while_busy, replaced.closed

    assert asyncio.run(scenario()) == (False, True)
    assert replica._closing == set()


class Runtime:
    """What ``_apply`` and ``Frontend`` read of a loaded version."""

    def __init__(self, served: ServedVersion) -> None:
        self.served = served
        self.spec = SimpleNamespace(task=served.task)
        self.in_flight = 0

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
    replica._unloadable = set()
    replica._applying = asyncio.Lock()
    replica._telemetry = NullTelemetry()
    replica._monitors = Monitors(replica._telemetry)
    return replica, loads


def test_a_version_a_replica_cannot_load_leaves_the_rest_of_its_table_serving(
    monkeypatch, tmp_path
):
    broken = {"2", "7", "8"}
    replica, loads = replica_with_table(monkeypatch, tmp_path, broken)
    table = [
        ServedVersion("a", "1", "text-classification", "src/a1", CHAMPION, 90),
        ServedVersion("a", "2", "text-classification", "src/a2", CANARY, 10),
        ServedVersion("b", "7", "text-classification", "src/b7"),
        ServedVersion("c", "3", "text-classification", "src/c3"),
        ServedVersion("d", "8", "text-classification", "src/d8", CHAMPION, 90),
        ServedVersion("d", "9", "text-classification", "src/d9", CANARY, 10),
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
    # Its canary alone would take all of d's traffic on this replica.
    with pytest.raises(BackendUnavailable, match="'d' is still loading"):
        frontend._model("d")
    with pytest.raises(ModelNotFound):
        frontend._model("nope")
    # Tried again later (the store answers by then); loaded versions are not loaded again.
    assert replica._unloadable == {("a", "2"), ("b", "7"), ("d", "8")}
    assert frontend.missing == ("a v2", "b v7", "d v8")  # /readyz names them
    broken.clear()
    del loads[:]
    asyncio.run(replica._retry_unloadable())
    assert sorted(loads) == ["a v2", "b v7", "d v8"] and replica._unloadable == set()
    assert sorted(replica._frontend.models) == ["a", "b", "c", "d"]
    assert replica._frontend.missing == ()
    # Only a version whose files changed (registered again) is loaded anew.
    del loads[:]
    again = ServedVersion("c", "3", "text-classification", "src/c3-registered-again")
    replica._apply([*table[:3], again], 6)
    assert loads == ["c v3"]


def test_a_version_being_reloaded_answers_nothing_until_its_new_files_arrive(monkeypatch, tmp_path):
    """While Triton reloads a version registered again from other files, nothing of what
    the replica loaded of its first files may answer: a reloading canary's share goes to
    its champion, a model whose champion reloads answers 503, and the first files'
    runtime is let go (drained before the table counts as adopted)."""
    replica, loads = replica_with_table(monkeypatch, tmp_path, broken=set())
    table = [
        ServedVersion("a", "1", "text-classification", "src/a1", CHAMPION, 90),
        ServedVersion("a", "2", "text-classification", "src/a2", CANARY, 10),
        ServedVersion("b", "1", "text-classification", "src/b1"),
    ]
    replica._apply(table, 1)
    del loads[:]
    reloading = [table[0], replace(table[1], reloading=True), replace(table[2], reloading=True)]
    replica._apply(reloading, 2)
    assert loads == []  # neither the first files nor anything else is loaded for them
    assert [r.served.version for r in replica._frontend.models["a"].versions] == ["1"]
    with pytest.raises(BackendUnavailable, match="'b' is still loading"):
        replica._frontend._model("b")
    assert set(replica._loaded) == {("a", "1")} and replica._frontend.missing == ()
    again = [table[0], replace(table[1], source="src/a2-again"), replace(table[2], source="b")]
    replica._apply(again, 3)
    assert sorted(loads) == ["a v2", "b v1"]
    assert replica._frontend.models["a"].versions[1].served.source == "src/a2-again"


def adoption_while_busy(replica, table: list[ServedVersion], busy) -> tuple[int, int]:
    """Pull ``table`` while ``busy`` (something with ``in_flight`` of 1) has a request
    under way; the replica's adopted table version then, and once the request is done."""

    async def newer(known: int):
        return replica._table_version + 1, [v.to_dict() for v in table]

    replica._state = SimpleNamespace(table=SimpleNamespace(remote=newer))
    installed = replica._table_version + 1

    async def scenario() -> tuple[int, int]:
        pulling = asyncio.create_task(replica._pull_table())
        while replica._table_version != installed:  # the new table is installed ...
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.02)  # ... and the request still under way
        while_busy = replica._adopted
        busy.in_flight = 0
        await pulling
        return while_busy, replica._adopted

    return asyncio.run(scenario())


def test_a_table_with_a_reloading_version_is_adopted_once_its_requests_are_done(
    monkeypatch, tmp_path
):
    replica, _ = replica_with_table(monkeypatch, tmp_path, broken=set())
    first = ServedVersion("a", "1", "text-classification", "src/a1")
    replica._apply([first], 1)
    replica._table_version, replica._adopted = 1, 1
    runtime = replica._loaded[("a", "1")]
    runtime.in_flight = 1  # a request still waits for Triton
    reloading = replace(first, reloading=True)
    assert adoption_while_busy(replica, [reloading], runtime) == (1, 2)


def test_a_table_is_adopted_once_the_previous_front_ends_requests_are_done(monkeypatch, tmp_path):
    """A request that entered the previous front-end and is still reading its body has
    picked no version yet; it will pick one of the previous table's, which Triton may
    unload (or reload) once the new table counts as adopted."""
    replica, _ = replica_with_table(monkeypatch, tmp_path, broken=set())
    first = ServedVersion("a", "1", "text-classification", "src/a1")
    replica._apply([first], 1)
    replica._table_version, replica._adopted = 1, 1
    previous = replica._frontend
    previous.in_flight = 1  # a request reading its body
    second = ServedVersion("a", "2", "text-classification", "src/a2")
    assert adoption_while_busy(replica, [second], previous) == (1, 2)
    assert replica._frontend is not previous


def test_table_entries_carry_the_reloading_mark_only_when_set():
    """Replicas rebuild entries with ServedVersion(**entry); those of a release before the
    mark, still running during an upgrade, must keep reading every ordinary table."""
    served = ServedVersion("a", "1", "text-classification", "src/a1", CANARY, 10)
    assert set(served.to_dict()) == {"name", "version", "task", "source", "role", "weight"}
    marked = replace(served, reloading=True)
    assert ServedVersion(**served.to_dict()) == served
    assert ServedVersion(**marked.to_dict()) == marked


def test_a_retry_that_ends_after_a_new_table_arrived_changes_nothing(monkeypatch, tmp_path):
    replica, _ = replica_with_table(monkeypatch, tmp_path, broken={"2"})
    first = [ServedVersion("a", "2", "text-classification", "src/a2")]
    replica._apply(first, 1)
    second = [ServedVersion("a", "3", "text-classification", "src/a3")]

    async def scenario() -> None:
        retry = asyncio.create_task(replica._retry_unloadable())
        await asyncio.sleep(0)  # the retry is loading, off the lock
        async with replica._applying:
            replica._apply(second, 2)
        await retry

    asyncio.run(scenario())
    assert replica._table_version == 2
    assert [r.served.version for r in replica._frontend.models["a"].versions] == ["3"]


def test_infergate_records_reach_the_replica_log_file_unbuffered(tmp_path):
    serve_logger, ours = logging.getLogger("ray.serve"), logging.getLogger("infergate")
    saved = (serve_logger.handlers[:], ours.handlers[:], ours.level, ours.propagate)
    path = tmp_path / "replica.log"
    file_handler = logging.FileHandler(path)
    # What Ray Serve sets up in a replica: a buffer in front of the file.
    serve_logger.handlers = [logging.handlers.MemoryHandler(1000, target=file_handler)]
    try:
        serve_app.log_to_replica_file()
        serve_app.log_to_replica_file()  # a second replica in the same process adds nothing
        logging.getLogger("infergate.frontend").info("table 3: ['a v1']")
        assert path.read_text() == "table 3: ['a v1']\n"
        for name in ("infergate.frontend", "infergate.triton.client"):
            filters = logging.getLogger(name).filters
            assert [type(f) for f in filters] == [serve_app.RepeatLimit], name
    finally:
        file_handler.close()
        serve_logger.handlers, ours.handlers = saved[0], saved[1]
        for name in ("infergate.frontend", "infergate.triton.client"):
            logger = logging.getLogger(name)
            logger.filters = [f for f in logger.filters if not isinstance(f, serve_app.RepeatLimit)]
        ours.setLevel(saved[2])
        ours.propagate = saved[3]


def test_a_failure_repeated_per_request_is_logged_once_per_window_with_a_count(caplog):
    now = [100.0]
    limit = serve_app.RepeatLimit(10.0, clock=lambda: now[0])
    logger = logging.getLogger("test.repeat_limit")
    logger.addFilter(limit)
    warn = "Triton inference on %s (%d rows) failed: %s"
    for rows in (3, 7, 1):  # one kind: only the number differs
        logger.warning(warn, "a__v1", rows, "UNAVAILABLE")
    logger.warning(warn, "b__v1", 2, "UNAVAILABLE")  # another model: another kind
    logger.error(warn, "a__v1", 2, "UNAVAILABLE")  # another level: another kind
    now[0] = 109.0
    logger.warning(warn, "a__v1", 5, "UNAVAILABLE")
    now[0] = 112.0
    logger.warning(warn, "a__v1", 4, "UNAVAILABLE")
    logger.warning(warn, "a__v1", 4, "UNAVAILABLE")
    now[0] = 200.0
    logger.warning(warn, "a__v1", 6, "UNAVAILABLE")
    logger.removeFilter(limit)
    assert caplog.messages == [
        "Triton inference on a__v1 (3 rows) failed: UNAVAILABLE",
        "Triton inference on b__v1 (2 rows) failed: UNAVAILABLE",
        "Triton inference on a__v1 (2 rows) failed: UNAVAILABLE",
        "Triton inference on a__v1 (4 rows) failed: UNAVAILABLE (3 more like it were not "
        "logged in the 12 s since the last one shown)",
        "Triton inference on a__v1 (6 rows) failed: UNAVAILABLE (1 more like it were not "
        "logged in the 88 s since the last one shown)",
    ]


def test_the_table_of_kinds_stays_bounded():
    now = [0.0]
    limit = serve_app.RepeatLimit(10.0, clock=lambda: now[0])
    records = [
        logging.LogRecord("x", logging.WARNING, __file__, 1, f"failure {kind}", (), None)
        for kind in ("a", "b", "c", "d")
    ]
    limit.MAX_KINDS = 3
    assert all(limit.filter(record) for record in records)  # the fourth clears the table
    assert len(limit._kinds) == 1
    now[0] = 20.0
    assert all(limit.filter(record) for record in records[:3])  # the old ones are pruned
    assert len(limit._kinds) == 3
