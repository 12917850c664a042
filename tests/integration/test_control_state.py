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


def test_many_replicas_waiting_for_one_version_make_one_demand(ray_cluster):
    """Load on demand's meeting point: every ``warm`` for a version waits for the one
    ``settle`` of it; the control plane sees the version once among its demands."""
    import ray

    from infergate.control.state import ControlState

    state = ControlState.options(name="residency-test", namespace="tests").remote()
    waiting = [state.warm.remote("m__v1", 30.0) for _ in range(8)]
    waiting.append(state.warm.remote("n__v1", 30.0))
    # An async actor runs calls out of their submission order: a ``demands`` may come
    # before the last ``warm``, so collect until both are seen, each exactly once.
    demanded: list[str] = []
    deadline = time.monotonic() + 10
    while len(set(demanded)) < 2 and time.monotonic() < deadline:
        demanded += ray.get(state.demands.remote(5.0))
    assert sorted(demanded) == ["m__v1", "n__v1"]
    assert ray.get(state.demands.remote(0.2)) == []  # taken once, not again
    ray.get(state.settle.remote("m__v1", None, ["10.0.0.2:8001"]))
    ray.get(state.settle.remote("n__v1", "no room", []))
    assert ray.get(waiting, timeout=10) == [(None, ["10.0.0.2:8001"])] * 8 + [("no room", [])]
    # One that nobody settles in time is told so; its demand stays for the control plane.
    assert ray.get(state.warm.remote("o__v1", 0.2), timeout=10) == ("still loading", [])
    assert ray.get(state.demands.remote(1.0)) == ["o__v1"]
    # Replicas' reports: what they used, and what has requests in flight.
    ray.get(state.report.remote("r1", 1, {}, {"m__v1": 2, "n__v1": 0}))
    ages, busy = ray.get(state.usage.remote())
    assert ages["m__v1"] < 5 and busy == ["m__v1"]
    ray.get(state.set_resident.remote({"m__v1": ["10.0.0.2:8001"]}))
    epoch = ray.get(state.current_epoch.remote())
    assert ray.get(state.get_resident.remote(epoch, 0)) == (1, {"m__v1": ["10.0.0.2:8001"]})
    assert ray.get(state.get_resident.remote(epoch, 1)) is None
    ray.kill(state)


def test_an_actor_gone_for_good_is_created_again_and_found_by_replicas(ray_cluster, tmp_path):
    """Killed with no restart (deleted by an operator, say), every handle on the actor can
    only fail: the control plane's next round creates it afresh, where its settings say,
    and publishes its table; a replica's link drops its dead handle and finds the new one."""
    import ray

    from infergate.control.state import ControlStateLink, find_control_state

    node = ray.get_runtime_context().get_node_id()
    labels = {"ray.io/node-id": node}
    config = StackConfig(state_dir=tmp_path, serve={"control_actor_labels": labels})  # type: ignore[arg-type]
    service = ControlService(config, MemoryRegistry(), clock=FakeClock())  # type: ignore[arg-type]
    service._app_deployed = True
    service._deploy(SERVED)
    replica = ControlStateLink(create=False)
    old = replica.actor()
    assert old is not None
    epoch, _, _ = ray.get(old.table.remote("", 0))

    ray.kill(old, no_restart=True)  # takes effect a moment later
    deadline = time.monotonic() + 30  # the name is free once Ray marked the actor dead
    while find_control_state() is not None:
        assert time.monotonic() < deadline, "the dead actor's name is still taken"
        time.sleep(0.2)
    with pytest.raises(ray.exceptions.ActorDiedError):
        ray.get(old.current_epoch.remote(), timeout=60)
    replica.failed(ray.exceptions.ActorDiedError())
    assert replica.actor() is None  # no control plane round yet: nothing to find

    service.rollouts.tick = list  # type: ignore[method-assign]
    service.run_due()  # fails on the dead handle: logged, and the handle is dropped
    service.run_due()  # creates the actor again and publishes
    found = replica.actor()
    assert found is not None
    new_epoch, version, table = ray.get(found.table.remote(epoch, 0))
    assert new_epoch != epoch and version == 1 and table == [v.to_dict() for v in SERVED]
