"""Hooks for every test: what a test needs of the machine fails it where missing, unless
TESTS_WITHOUT excuses the machine (tests/machine.py)."""

from __future__ import annotations

import pytest

import machine


def pytest_configure(config: pytest.Config) -> None:
    names = machine.unknown()
    if names:
        raise pytest.UsageError(
            f"{machine.WITHOUT} names no capability {', '.join(names)}; "
            f"known: {', '.join(machine.CAPABILITIES)}"
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures start anything."""
    machine.check(item)
