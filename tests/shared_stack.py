"""The session's shared stack (``stack`` in tests/e2e/conftest.py) stops after the last
test on it rather than at the end of the run: idle, a stack still takes about a fifth of a
core (Ray's agents and actors, the replicas' flushes), which the modules with stacks of
their own and the unit tests are better given. The modules on it run first for that.

On pytest-xdist's workers too: the modules on it are one unit of work, run whole and in
order by one worker (tests/workers.py). tests/e2e/conftest.py takes the two hooks below
as its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

STOPS = pytest.StashKey[ExitStack]()
LAST_ON_IT = pytest.StashKey[str | None]()


def on_shared_stack(item: pytest.Item) -> bool:
    """Whether ``item`` asks for the session's ``stack``, directly or through a module
    fixture of that name that builds on it (registering its own models there)."""
    if "stack" not in item.fixturenames:
        return False
    definitions = item._fixtureinfo.name2fixturedefs.get("stack", ())  # outermost first
    for definition in reversed(definitions):
        if definition.scope == "session":
            return True
        if "stack" not in definition.argnames:  # a stack of the module's own
            return False
    return False


@contextmanager
def stopping(config: pytest.Config) -> Iterator[ExitStack]:
    """What the ``stack`` fixture enters its stack into, closed after the last test on
    it (or at the end, as any session fixture)."""
    with ExitStack() as stops:
        config.stash[STOPS] = stops
        yield stops


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not on_shared_stack(item))  # stable: otherwise as collected


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    torn_down = yield
    stash = item.config.stash
    if STOPS not in stash:
        return torn_down
    if LAST_ON_IT not in stash:
        on_it = [other.nodeid for other in item.session.items if on_shared_stack(other)]
        stash[LAST_ON_IT] = on_it[-1] if on_it else None
    if item.nodeid == stash[LAST_ON_IT]:
        stash[STOPS].close()
    return torn_down
