"""The session's shared stack runs its modules first and stops after the last test on it
(tests/shared_stack.py): checked on small test files run by pytest itself, with a stack
that only writes down when it starts and stops."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

CONFTEST = """
from contextlib import contextmanager

import pytest
from shared_stack import pytest_collection_modifyitems, pytest_runtest_teardown, stopping

def note(what):
    with open("events.txt", "a") as events:
        events.write(what + "\\n")

@contextmanager
def running():
    note("up")
    yield "shared"
    note("down")

@pytest.fixture(scope="session")
def stack(pytestconfig):
    with stopping(pytestconfig) as stops:
        yield stops.enter_context(running())

@pytest.fixture(scope="session")
def http(stack):
    return stack
"""

MODULES = {
    # a module of its own stack, collected first
    "test_a_own": """
import pytest
from conftest import note

@pytest.fixture(scope="module")
def stack():
    return "own"

def test_own(stack):
    note(f"own {stack}")
""",
    # on the shared stack through a fixture that builds on it
    "test_b_builds": """
import pytest
from conftest import note

@pytest.fixture(scope="module")
def stack(stack):
    return stack + " with a model"

def test_builds(stack):
    note(f"builds {stack}")
""",
    "test_c_plain": """
from conftest import note

def test_plain():
    note("plain")
""",
    # on the shared stack through another session fixture
    "test_d_http": """
from conftest import note

def test_http(http):
    note(f"http {http}")
""",
}


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(**MODULES)
    return pytester


def events(pytester: pytest.Pytester) -> list[str]:
    return (pytester.path / "events.txt").read_text().splitlines()


def test_the_modules_on_the_shared_stack_run_first_and_it_stops_after_the_last(suite):
    suite.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=4)
    assert events(suite) == [
        "up",
        "builds shared with a model",
        "http shared",
        "down",
        "own own",
        "plain",
    ]


def test_without_a_test_on_it_the_shared_stack_never_starts(suite):
    suite.runpytest("-p", "no:cacheprovider", "-k", "own or plain").assert_outcomes(passed=2)
    assert events(suite) == ["own own", "plain"]


def test_run_in_part_it_stops_after_the_last_test_selected(suite):
    suite.runpytest("-p", "no:cacheprovider", "-k", "builds or plain").assert_outcomes(passed=2)
    assert events(suite) == ["up", "builds shared with a model", "down", "plain"]
