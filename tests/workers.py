"""The tests on several workers (`make test`, two unless the machine has one core:
pytest-xdist's ``-n 2 --dist loadfile``): what keeps two workers from harming each
other's tests.

- A module runs whole on one worker (``loadfile``): its stack is a module fixture,
  started once. What two modules on two workers could both take is taken by claim: free
  ports (``free_ports``), a network namespace's subnet (``network_hosts``).
- A test marked ``quiet`` bounds a latency or a recovery time: it runs with no test of
  another worker beside it. Every test holds a shared lock from its setup to its teardown
  (a module's stack starts in its first test's setup and stops in its last one's
  teardown); a quiet test holds it alone. A quiet test that waits for it closes a
  turnstile first, so the other worker starts nothing new meanwhile.
- The modules on the session's stack (``tests/shared_stack.py``) are one unit of work,
  not one each: a single worker runs them all, in order, on one stack, which stops after
  the last of them as in a run without workers (``Scheduling``). A worker that collected
  them tells the controller which they are through the run's folder.
- The end-to-end modules go first and the unit tests last, where they fill a worker
  while the other finishes a long module: pytest collects ``tests/`` folder by folder in
  alphabetical order (e2e, integration, unit), those on the session stack moved first,
  and the modules are handed out in that order (``--no-loadscope-reorder``, in the
  Makefile, keeps it from putting the units with the most tests first).

Run without workers (one module, ``make test-unit``), none of this changes anything.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from xdist.scheduler import LoadFileScheduling

SHARED_STACK = "the session's stack"  # the unit of work of the modules on it
SHARED_MODULES = "shared-stack-modules.json"


def worker_run(config: pytest.Config) -> str | None:
    """The id of the run this worker belongs to, None outside pytest-xdist's workers."""
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else str(workerinput["testrunuid"])


def run_folder(run: str) -> Path:
    """Where the workers of run ``run`` and their controller leave each other files."""
    folder = Path(tempfile.gettempdir()) / f"pytest-workers-{run}"
    folder.mkdir(exist_ok=True)
    return folder


def share_run_id(config: pytest.Config) -> None:
    """On the controller of a parallel run: choose the run's id now (pytest-xdist would
    when it starts the workers), so that the controller knows the run's folder too."""
    controller = getattr(config, "workerinput", None) is None
    parallel = config.getoption("dist", "no") != "no"
    if controller and parallel and config.getoption("testrunuid", None) is None:
        config.option.testrunuid = uuid.uuid4().hex


def tell_shared_modules(config: pytest.Config, modules: Iterable[str]) -> None:
    """On a worker, once it has collected: which modules run on the session's stack."""
    run = worker_run(config)
    if run is None:
        return
    folder = run_folder(run)
    written = folder / f"{SHARED_MODULES}.{os.getpid()}"
    written.write_text(json.dumps(sorted(set(modules))))
    written.replace(folder / SHARED_MODULES)  # whole or not at all: every worker writes it


def shared_modules(run: str) -> frozenset[str]:
    """On the controller, once its workers have collected: what they told."""
    path = run_folder(run) / SHARED_MODULES
    if not path.exists():
        raise pytest.UsageError(
            f"the workers did not say which modules share the session's stack ({path} missing)"
        )
    return frozenset(json.loads(path.read_text()))


class Scheduling(LoadFileScheduling):
    """``--dist loadfile`` with the modules on the session's stack as one unit (see the
    module's docstring). The controller reads them when it first splits the collection,
    after every worker has collected (and written them)."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)
        self._run = str(config.getoption("testrunuid"))
        self._shared: frozenset[str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._shared is None:
            self._shared = shared_modules(self._run)
        module = super()._split_scope(nodeid)
        return SHARED_STACK if module in self._shared else module


@contextmanager
def turn(item: pytest.Item) -> Iterator[None]:
    """Hold the shared lock while ``item`` runs, or, for a quiet test, the lock alone."""
    run = worker_run(item.config)
    if run is None:
        yield
        return
    folder = run_folder(run)
    quiet = item.get_closest_marker("quiet") is not None
    with ExitStack() as held:
        turnstile = held.enter_context((folder / "turnstile").open("a"))
        running = held.enter_context((folder / "running").open("a"))
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        held.callback(fcntl.flock, turnstile, fcntl.LOCK_UN)
        fcntl.flock(running, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
        held.callback(fcntl.flock, running, fcntl.LOCK_UN)
        if not quiet:  # through the turnstile: a quiet test may close it behind us
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield
