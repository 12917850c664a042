"""How the tests share two workers (tests/workers.py): a quiet test runs alone, and
waits neither forever nor beside anything."""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

import workers


class Item(SimpleNamespace):
    """What ``workers.turn`` reads of a test: its run's id and whether it is quiet."""

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "quiet" and self.quiet else None


@pytest.fixture(autouse=True)
def lock_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the locks' folder, not /tmp


def item(run: str, quiet: bool = False) -> Item:
    return Item(config=SimpleNamespace(workerinput={"testrunuid": run}), quiet=quiet)


def hold(test: Item, events: list[str], name: str, seconds: float) -> threading.Thread:
    def run() -> None:
        with workers.turn(test):  # type: ignore[arg-type]
            events.append(f"{name} in")
            time.sleep(seconds)
            events.append(f"{name} out")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_tests_run_beside_each_other_and_a_quiet_one_alone() -> None:
    run, events = uuid.uuid4().hex, []
    first = hold(item(run), events, "a", 0.4)
    second = hold(item(run), events, "b", 0.4)
    time.sleep(0.1)
    assert sorted(events) == ["a in", "b in"]  # side by side
    quiet = hold(item(run, quiet=True), events, "quiet", 0.3)
    time.sleep(0.1)
    late = hold(item(run), events, "late", 0.0)  # came after the quiet one: waits for it
    for thread in (first, second, quiet, late):
        thread.join(5)
    assert events.index("quiet in") > max(events.index("a out"), events.index("b out"))
    assert events.index("late in") > events.index("quiet out")


def test_outside_a_parallel_run_nothing_waits() -> None:
    test = Item(config=SimpleNamespace(), quiet=True)
    with workers.turn(test), workers.turn(test):  # type: ignore[arg-type]
        pass


@pytest.mark.parametrize("quiet", [False, True])
def test_a_test_that_fails_lets_the_others_through(quiet: bool) -> None:
    run = uuid.uuid4().hex
    with pytest.raises(RuntimeError), workers.turn(item(run, quiet)):  # type: ignore[arg-type]
        raise RuntimeError("the test failed")
    events: list[str] = []
    hold(item(run, quiet=True), events, "next", 0.0).join(2)
    assert events == ["next in", "next out"]


def test_the_controller_reads_which_modules_its_workers_found_on_the_shared_stack() -> None:
    run = uuid.uuid4().hex
    with pytest.raises(pytest.UsageError, match="did not say"):
        workers.shared_modules(run)
    worker = SimpleNamespace(workerinput={"testrunuid": run})
    on_it = ["tests/e2e/test_stack.py", "tests/e2e/test_canary.py", "tests/e2e/test_stack.py"]
    for _ in range(2):  # each worker writes it, whole
        workers.tell_shared_modules(worker, on_it)  # type: ignore[arg-type]
    assert workers.shared_modules(run) == {"tests/e2e/test_stack.py", "tests/e2e/test_canary.py"}
    assert [p.name for p in workers.run_folder(run).iterdir()] == [workers.SHARED_MODULES]
    workers.tell_shared_modules(SimpleNamespace(), ["x"])  # type: ignore[arg-type]  # no worker
    assert workers.shared_modules(run) == {"tests/e2e/test_stack.py", "tests/e2e/test_canary.py"}
