"""A test whose machine precondition is missing fails, saying what to do, unless
TESTS_WITHOUT excuses the machine (tests/machine.py, tests/conftest.py): checked
on small test files run by pytest itself with the hooks of tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import machine

pytest_plugins = ["pytester"]

HOOKS = (Path(__file__).resolve().parents[1] / "conftest.py").read_text()
TESTS = """
import pytest
from machine import lacking

@pytest.mark.machine("prometheus", "no promtool")
def test_marked():
    pass

@pytest.mark.machine("prometheus", None)
def test_present():
    pass

@pytest.fixture
def rampart():
    lacking("rampart", "no rampart")

def test_from_a_fixture(rampart):
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv(machine.WITHOUT, raising=False)
    pytester.makeconftest(HOOKS)
    pytester.makeini("[pytest]\naddopts = --strict-markers\nmarkers =\n    machine: a need\n")
    pytester.makepyfile(TESTS)
    return pytester


def test_a_missing_precondition_fails_with_one_line_saying_what_to_do(suite):
    result = suite.runpytest("-ra")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_marked*",
            "this machine should run it: no promtool; `make test` installs it as root; "
            "set TESTS_WITHOUT=prometheus on a machine that cannot",
            "*ERROR at setup of test_from_a_fixture*",
            "this machine should run it: no rampart; * TESTS_WITHOUT=rampart *",
            "*short test summary info*",
        ]
    )


def test_the_setting_turns_the_failure_into_a_skip_for_what_it_names(suite, monkeypatch):
    monkeypatch.setenv(machine.WITHOUT, "netns, prometheus")
    result = suite.runpytest("-ra")
    result.assert_outcomes(passed=1, skipped=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED *this machine cannot run it (TESTS_WITHOUT=prometheus): no promtool",
            "ERROR *::test_from_a_fixture*",  # the reason follows it in CI (not cut to width)
        ]
    )


def test_a_name_that_is_no_capability_stops_the_run(suite, monkeypatch):
    monkeypatch.setenv(machine.WITHOUT, "prometheus,promtool")
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*TESTS_WITHOUT names no capability promtool; known: *"])


def test_the_setting_is_a_comma_separated_list():
    assert machine.excused({machine.WITHOUT: " netns,,postgres "}) == {"netns", "postgres"}
    assert machine.excused({}) == set()
    assert machine.unknown({machine.WITHOUT: "mount,ipv6"}) == ["ipv6"]
