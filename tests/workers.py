"""The tests on several workers (`make test TEST_WORKERS=2`: pytest-xdist's ``-n 2 --dist
loadfile``): what keeps two workers from harming each other's tests.

- A module runs whole on one worker (``loadfile``): its stack is a module fixture,
  started once. What two modules on two workers could both take is taken by claim: free
  ports (``free_ports``), a network namespace's subnet (``network_hosts``).
- A test marked ``quiet`` bounds a latency or a recovery time: it runs with no test of
  another worker beside it. Every test holds a shared lock from its setup to its teardown
  (a module's stack starts in its first test's setup and stops in its last one's
  teardown); a quiet test holds it alone. A quiet test that waits for it closes a
  turnstile first, so the other worker starts nothing new meanwhile.
- The end-to-end modules go first and the unit tests last, where they fill a worker
  while the other finishes a long module: pytest collects ``tests/`` folder by folder in
  alphabetical order (e2e, integration, unit), those on the session stack moved first
  (``tests/shared_stack.py``), and ``loadfile`` hands modules out in that order
  (``--no-loadscope-reorder``, in the Makefile, keeps it from putting the modules with
  the most tests first). On workers the session stack stops at the end of the run.

Run without workers (one module, ``make test-unit``), none of this changes anything.
"""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest


def worker_run(config: pytest.Config) -> str | None:
    """The id of the run this worker belongs to, None outside pytest-xdist's workers."""
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else str(workerinput["testrunuid"])


@contextmanager
def turn(item: pytest.Item) -> Iterator[None]:
    """Hold the shared lock while ``item`` runs, or, for a quiet test, the lock alone."""
    run = worker_run(item.config)
    if run is None:
        yield
        return
    folder = Path(tempfile.gettempdir()) / f"pytest-workers-{run}"
    folder.mkdir(exist_ok=True)
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
