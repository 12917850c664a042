"""What a test needs of the machine (root, `ip netns`, PostgreSQL, Prometheus, ...).

A test declares it with ``@pytest.mark.machine(capability, missing)``, ``missing`` saying
what is absent here (None when nothing is). Where something is missing the test fails,
not skips: `make test` installs what these tests need where it can, so a multi-machine, fault or
monitoring test that silently skipped would be a test nobody ran. A machine that cannot
run them says so explicitly: TESTS_WITHOUT names the capabilities it lacks
(comma-separated), and those tests skip with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NoReturn

import pytest

WITHOUT = "TESTS_WITHOUT"
# Each capability, with how a machine gets it.
CAPABILITIES = {
    "prometheus": "`make test` installs it as root",
    "postgres": "`make test` installs it as root",
    "netns": "`make test` installs it as root",
    "mount": "run the tests as root",
    "compose": "install Docker Compose v2 (Debian 12 has none; Docker's docker-compose-plugin)",
    "rampart": "`make install` installs it",
}


def excused(environ: Mapping[str, str] = os.environ) -> set[str]:
    """The capabilities TESTS_WITHOUT says this machine lacks."""
    return {name.strip() for name in environ.get(WITHOUT, "").split(",") if name.strip()}


def unknown(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Names in TESTS_WITHOUT that are no capability: a typo there excuses
    nothing, and the run should say so before any test fails for it."""
    return sorted(excused(environ) - set(CAPABILITIES))


def lacking(capability: str, missing: str, environ: Mapping[str, str] = os.environ) -> NoReturn:
    """Skip the running test if the machine is excused from ``capability``, else fail it
    with a one-line reason saying what to do."""
    if capability in excused(environ):
        pytest.skip(f"this machine cannot run it ({WITHOUT}={capability}): {missing}")
    pytest.fail(
        f"this machine should run it: {missing}; {CAPABILITIES[capability]}; "
        f"set {WITHOUT}={capability} on a machine that cannot",
        pytrace=False,
    )


def check(item: pytest.Item, environ: Mapping[str, str] = os.environ) -> None:
    """Apply the ``machine`` markers of ``item`` (see the module's docstring)."""
    for marker in item.iter_markers("machine"):
        capability, missing = marker.args
        assert capability in CAPABILITIES, f"{item.nodeid}: unknown capability {capability}"
        if missing:
            lacking(capability, missing, environ)
