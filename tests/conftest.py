"""Hooks for every test: what a test needs of the machine fails it where missing, unless
TESTS_WITHOUT excuses the machine (tests/machine.py); how tests share the workers of a
parallel run (tests/workers.py); and, after the run, where its time went by folder and
module."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import pytest

import machine
import workers
from shared_stack import on_shared_stack


def pytest_configure(config: pytest.Config) -> None:
    workers.share_run_id(config)
    names = machine.unknown()
    if names:
        raise pytest.UsageError(
            f"{machine.WITHOUT} names no capability {', '.join(names)}; "
            f"known: {', '.join(machine.CAPABILITIES)}"
        )


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> workers.Scheduling | None:
    """``--dist loadfile`` (the Makefile's) with the session stack's modules as one unit."""
    return workers.Scheduling(config, log) if config.getoption("dist") == "loadfile" else None


@pytest.hookimpl(trylast=True)  # after tests/e2e's, which puts them first
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers.tell_shared_modules(config, [i.nodeid.split("::", 1)[0] for i in items
                                         if on_shared_stack(i)])  # fmt: skip


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures start anything."""
    machine.check(item)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's clock
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with workers.turn(item):
        yield


# Where a run's time goes, by module and by folder: pytest's --durations lists single
# phases, while a module's stack start, its tests and its teardown add up to what CI waits.
# The session stack's start counts for the first module that asks for it, its stop for the
# last (tests/shared_stack.py).
_seconds_by_module: dict[str, float] = defaultdict(float)
SLOWEST_MODULES = 15


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds_by_module[report.nodeid.split("::", 1)[0]] += report.duration


@pytest.hookimpl(trylast=True)  # after pytest's own --durations list
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _seconds_by_module:
        return
    by_folder: dict[str, float] = defaultdict(float)
    for module, seconds in _seconds_by_module.items():
        by_folder["/".join(module.split("/")[:2])] += seconds
    write = terminalreporter.write_line
    terminalreporter.section("time by folder and slowest modules (setup + call + teardown)")
    for folder, seconds in sorted(by_folder.items(), key=lambda kv: -kv[1]):
        write(f"{seconds:8.1f}s  {folder}/")
    slowest = sorted(_seconds_by_module.items(), key=lambda kv: -kv[1])[:SLOWEST_MODULES]
    for module, seconds in slowest:
        write(f"{seconds:8.1f}s  {module}")
