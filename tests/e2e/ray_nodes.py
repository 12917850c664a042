"""A Ray cluster of two "hosts" for the e2e tests: a head on this machine and a worker node
in a network namespace (``network_hosts``), as an operator runs them (`ray start`), with
what the tests ask of it through Ray's state API: its nodes, where the front-end replicas
and the ``ControlState`` actor run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from conftest import Stack, wait_for

from network_hosts import Host

BIN = Path(sys.executable).parent
# Ray turns token authentication on for new clusters; the nodes of this machine share the
# token file, so the worker joins with it. A raylet stops its node when its agent has not
# registered within 30 s; on two busy cores the head's took longer ("Timed out waiting for
# file .../metrics_agent_port_...", then "The current node timed out during startup").
RAY_ENV = {
    "RAY_AUTH_MODE": "token",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_agent_register_timeout_ms": "300000",
}


@dataclass
class Cluster:
    host: Host
    gcs: str  # the head's address, for `ray start --address`
    dashboard: str  # http://..., for `serve deploy` and the state API
    client: str  # ray://..., for `infergate up`
    http_port: int  # Serve's ingress on every node
    head: subprocess.Popen[bytes]
    env: dict[str, str]
    workdir: Path
    worker: subprocess.Popen[bytes] | None = None

    def start_worker(self) -> None:
        command = self.host.command(
            str(BIN / "ray"), "start", "--address", self.gcs, "--node-ip-address",
            self.host.address, "--num-cpus=1", "--disable-usage-stats", "--block",
        )  # fmt: skip
        with (self.workdir / "worker.log").open("ab") as log:
            self.worker = subprocess.Popen(command, env=self.env, stdout=log, stderr=log)
        wait_for(lambda: len(self.nodes()) == 2, 60, "the worker node joining")

    def lose_worker(self) -> None:
        """Every process of the worker's host dies at once, as when a machine is lost."""
        pids = subprocess.run(
            ["ip", "netns", "pids", self.host.name], capture_output=True, text=True
        ).stdout.split()
        for pid in pids:
            os.kill(int(pid), signal.SIGKILL)
        if self.worker is not None:
            self.worker.wait(timeout=30)

    def nodes(self) -> list[str]:
        """The IP of every live node."""
        alive = self._state("nodes", state="ALIVE")
        return [node["node_ip"] for node in alive]

    def replica_nodes(self) -> list[str]:
        """The node (IP) of every live front-end replica."""
        ips = {node["node_id"]: node["node_ip"] for node in self._state("nodes")}
        actors = self._state("actors", class_name="ServeReplica:infergate:frontend", state="ALIVE")
        return sorted(ips[actor["node_id"]] for actor in actors)

    def node_id(self, ip: str) -> str:
        """Ray's id of the live node at ``ip``."""
        nodes = self._state("nodes", state="ALIVE")
        return next(n["node_id"] for n in nodes if n["node_ip"] == ip and n["state"] == "ALIVE")

    def control_actor(self) -> tuple[str, int] | None:
        """Where the live ``ControlState`` actor runs (its node's IP) and how often Ray
        restarted it; None while there is none (being created, or restarting)."""
        ips = {node["node_id"]: node["node_ip"] for node in self._state("nodes")}
        actors = self._state("actors", detail=True, class_name="ControlState", state="ALIVE")
        if not actors:
            return None
        (actor,) = actors
        return ips[actor["node_id"]], int(actor["num_restarts"])

    def _state(self, resource: str, *, detail: bool = False, **equal: str) -> list[dict]:
        """Ray's state API over HTTP, with the cluster's token. Not ray.util.state: Ray
        reads its auth mode once per process, and an earlier test of the session may
        have read it as off."""
        params: dict[str, list[str] | str] = {
            "filter_keys": list(equal),
            "filter_predicates": ["="] * len(equal),
            "filter_values": list(equal.values()),
            "limit": "1000",
            "detail": str(detail).lower(),
        }
        answer = httpx.get(
            f"{self.dashboard}/api/v0/{resource}",
            params=params,
            headers={"authorization": f"Bearer {_ray_token()}"},
            timeout=30,
        )
        answer.raise_for_status()
        return answer.json()["data"]["result"]["result"]


def _ray_token() -> str:
    """The token `ray start` made for the cluster (RAY_AUTH_MODE=token), where Ray keeps it."""
    token = os.environ.get("RAY_AUTH_TOKEN")
    return token or (Path.home() / ".ray" / "auth_token").read_text().strip()


def control_plane_pid(stack: Stack) -> int:
    """The process of the stack's control plane (`infergate up`)."""
    return int(json.loads((stack.state_dir / "stack.json").read_text())["pid"])


# Through Ray's API, as an operator could: the actor deleted for good (every handle on it
# then fails, and is looked up again by name) and created anew on a node (soft: Ray restarts
# it elsewhere when that node is lost), where the control plane, started again, finds it.
MOVE_CONTROL_ACTOR = """
import sys, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from infergate.control.state import STATE_ACTOR, STATE_NAMESPACE, ControlState, find_control_state
ray.init()
ray.kill(find_control_state(), no_restart=True)  # every handle on it fails from now on
deadline = time.monotonic() + 60
while find_control_state() is not None:  # the name is free once Ray marked it dead
    assert time.monotonic() < deadline, "the killed actor's name is still taken"
    time.sleep(0.2)
actor = ControlState.options(
    name=STATE_ACTOR, namespace=STATE_NAMESPACE, lifetime="detached",
    scheduling_strategy=NodeAffinitySchedulingStrategy(sys.argv[1], soft=True),
).remote()
ray.get(actor.current_epoch.remote(), timeout=60)
"""


def place_control_actor(cluster: Cluster, stack: Stack, ip: str) -> None:
    """The ControlState actor on the node at ``ip``: the control plane stopped (a lost pod),
    the actor moved there through Ray's API, the control plane started again (moved or
    not, so that a failed move fails this test alone)."""
    placed = cluster.control_actor()
    if placed is not None and placed[0] == ip:
        return
    os.kill(control_plane_pid(stack), signal.SIGKILL)
    try:
        placed = _move_control_actor(cluster, stack, ip)
    finally:
        restarted = stack.cli("up", "--detach", timeout=300)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert cluster.control_actor() == placed  # the control plane took it as it was


def _move_control_actor(cluster: Cluster, stack: Stack, ip: str) -> tuple[str, int]:
    """Node affinity is soft (so that Ray can restart the actor elsewhere): a busy node's
    raylet may turn the lease down and the actor land on another node. A clean-clone run
    saw five moves in a row, within 25 s, land on the head: the move is tried again, with
    a pause, for two minutes."""
    landed = []
    deadline = time.monotonic() + 120
    while True:
        command = [sys.executable, "-c", MOVE_CONTROL_ACTOR, cluster.node_id(ip)]
        moved = subprocess.run(command, env=stack.env, capture_output=True, text=True, timeout=300)
        assert moved.returncode == 0, moved.stderr[-2000:]
        placed = wait_for(cluster.control_actor, 60, "the moved actor alive")
        if placed[0] == ip:
            return placed
        landed.append(placed[0])
        assert time.monotonic() < deadline, f"the actor landed on {landed}, never on {ip}"
        time.sleep(3)
