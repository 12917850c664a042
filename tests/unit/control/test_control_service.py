"""The control plane's rounds, built without Ray (the ControlState actor is only reached
when a table is published)."""

import logging

from fakes import FakeClock, MemoryRegistry
from infergate.config import StackConfig
from infergate.control.reconcile import ReconcileResult
from infergate.control.service import ControlService


def test_a_reconcile_failing_after_triton_restarted_does_not_stop_the_stack(tmp_path, caplog):
    """Triton came back while MLflow is away: the reconcile fails, and the supervisor that
    called this must go on (the next check finds the versions missing and tries again)."""
    service = ControlService(StackConfig(state_dir=tmp_path), MemoryRegistry())  # type: ignore[arg-type]

    def registry_away() -> None:
        raise ConnectionError("MLflow does not answer")

    service.plane.reconcile = registry_away  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="infergate.control.service"):
        service.triton_restarted()
    assert "reconciling after Triton started again failed" in caplog.text
    assert "MLflow does not answer" in caplog.text


def test_a_failing_round_is_logged_and_tried_again_at_its_next_interval(tmp_path, caplog):
    clock = FakeClock(100.0)
    config = StackConfig(state_dir=tmp_path)
    service = ControlService(config, MemoryRegistry(), clock=clock)  # type: ignore[arg-type]
    attempts: list[float] = []

    def registry_away() -> None:
        attempts.append(clock())
        raise ConnectionError("MLflow does not answer")

    service.plane.reconcile = registry_away  # type: ignore[method-assign]
    service.plane.lacking = dict  # type: ignore[method-assign]
    service.rollouts.tick = list  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="infergate.control.service"):
        for _ in range(3):
            clock.advance(config.reconcile_interval_s)
            service.run_due()
    assert len(attempts) == 3 and caplog.text.count("control loop round failed") == 3


def test_a_held_back_version_is_tried_again_at_every_check(tmp_path):
    """A new version waiting for room in the artifact cache (or for Triton) does not wait
    for the next reconcile interval: each check wakes a reconcile while it waits."""
    clock = FakeClock(100.0)
    config = StackConfig(state_dir=tmp_path)
    assert config.triton.check_interval_s * 3 < config.reconcile_interval_s
    service = ControlService(config, MemoryRegistry(), clock=clock)  # type: ignore[arg-type]
    rounds: list[float] = []

    def reconcile() -> ReconcileResult:
        rounds.append(clock())
        return ReconcileResult()

    service.plane.reconcile = reconcile  # type: ignore[method-assign]
    service.plane.lacking = dict  # type: ignore[method-assign]
    service.rollouts.tick = list  # type: ignore[method-assign]
    service.plane.held_back = {"m__v2"}
    for _ in range(2):
        clock.advance(config.triton.check_interval_s)
        service.run_due()
    assert len(rounds) == 2
    service.plane.held_back = set()  # it loaded
    clock.advance(config.triton.check_interval_s)
    service.run_due()
    assert len(rounds) == 2
