"""The ControlState actor on a real Ray (a local cluster of its own): killed, Ray starts it
again empty under a new epoch, the control plane publishes its table again at its next
round, and a replica's pull takes that table although its number went down."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from fakes import FakeClock, MemoryRegistry
from infergate.config import StackConfig
from infergate.control.service import ControlService
from infergate.versions import ServedVersion

SERVED = [ServedVersion("m", "1", "text-classification", "src/m1")]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    import ray

    # "local": a cluster of its own, never a stack's that may run on this machine.
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_a_restarted_actor_gets_the_table_again(ray_cluster, tmp_path):
    import ray

    service = ControlService(StackConfig(state_dir=tmp_path), MemoryRegistry(), clock=FakeClock())  # type: ignore[arg-type]
    service._app_deployed = True  # no Serve application here: the table alone
    service._deploy(SERVED)
    state = service._state
    epoch, version, table = ray.get(state.table.remote("", 0))  # a replica's first pull
    assert table == [v.to_dict() for v in SERVED]
    for _ in range(3):  # more tables: a replica's number is now above a fresh actor's
        service._deploy(SERVED)
    epoch, version, _ = ray.get(state.table.remote(epoch, 0))
    assert version == 4 and ray.get(state.table.remote(epoch, version)) is None

    ray.kill(state, no_restart=False)  # as when its node is lost
    deadline = time.monotonic() + 60
    while ray.get(state.current_epoch.remote(), timeout=60) == epoch:
        assert time.monotonic() < deadline, "the actor did not come back"
        time.sleep(0.2)
    # Empty: the replica keeps routing by the table it has.
    assert ray.get(state.table.remote(epoch, version)) is None

    service.rollouts.tick = list  # type: ignore[method-assign]  # nothing else is due
    service.run_due()  # the control plane's next round sees the new epoch
    new_epoch, new_version, table = ray.get(state.table.remote(epoch, version))
    assert new_epoch != epoch and new_version == 1  # taken although 1 < 4
    assert table == [v.to_dict() for v in SERVED]
