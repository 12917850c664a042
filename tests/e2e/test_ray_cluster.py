"""The front-end on a Ray cluster the platform did not start: a head on this machine and a
worker node on another "host" (a network namespace with its own address), as an operator
runs them (`ray start`), the Serve application deployed declaratively (`serve deploy`, as
KubeRay does), Triton and MLflow reachable from both nodes, and `infergate up` joining with
serve.external to publish traffic tables. The replicas run on both nodes; the worker node
lost under load, then back, gets its replica again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import Load, Stack, running_stack, stack_env, wait_for

from infergate.config import MlflowSettings
from infergate.stack import mlflow_server
from infergate.stack.processes import descendants, free_ports, reap
from network_hosts import Host, network_host, unavailable
from tiny_models import tiny_bert
from triton_process import stop_process

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.machine("netns", unavailable()),
]
MODEL = "spread"
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

    def _state(self, resource: str, **equal: str) -> list[dict]:
        """Ray's state API over HTTP, with the cluster's token. Not ray.util.state: Ray
        reads its auth mode once per process, and an earlier test of the session may
        have read it as off."""
        params: dict[str, list[str] | str] = {
            "filter_keys": list(equal),
            "filter_predicates": ["="] * len(equal),
            "filter_values": list(equal.values()),
            "limit": "1000",
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("ray-cluster")
    env = {**os.environ, **RAY_ENV}
    subnet = (os.getpid() + 1) % 250
    with network_host(f"igr{os.getpid() % 10000}", subnet) as host:
        gcs_port, dashboard_port, client_port, http_port = free_ports(4)
        head_command = [
            str(BIN / "ray"), "start", "--head", "--node-ip-address", host.gateway,
            f"--port={gcs_port}", "--num-cpus=1", f"--dashboard-host={host.gateway}",
            f"--dashboard-port={dashboard_port}", f"--ray-client-server-port={client_port}",
            "--disable-usage-stats", "--block",
        ]  # fmt: skip
        with (workdir / "head.log").open("wb") as log:
            head = subprocess.Popen(head_command, env=env, stdout=log, stderr=log)
        running = Cluster(
            host, f"{host.gateway}:{gcs_port}", f"http://{host.gateway}:{dashboard_port}",
            f"ray://{host.gateway}:{client_port}", http_port, head, env, workdir,
        )  # fmt: skip
        try:
            try:
                wait_for(lambda: _answers(running), 180, "the Ray head")
            except AssertionError as error:
                log = (workdir / "head.log").read_text(errors="replace")[-3000:]
                raise AssertionError(
                    f"{error}; last: {_last_errors[-1:]}; head log: {log}"
                ) from None
            running.start_worker()
            yield running
        finally:
            running.lose_worker()
            reap([head.pid, *descendants([head.pid])])
            head.wait(timeout=60)
            # What `ray stop` would remove: the pointer to this cluster, for Ray clients
            # that look for "the" cluster of this machine.
            current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
            if current.exists() and current.read_text().strip() == running.gcs:
                current.unlink()


def _answers(cluster: Cluster) -> bool:
    try:
        return bool(cluster.nodes())
    except Exception as error:  # the dashboard not up yet: refused, or not serving the API yet
        _last_errors.append(f"{type(error).__name__}: {error}")
        return False


_last_errors: list[str] = []


@pytest.fixture(scope="module")
def stack(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state_dir = tmp_path_factory.mktemp("cluster-stack")
    env = {**stack_env(state_dir), **RAY_ENV}
    gateway = cluster.host.gateway
    # Triton and MLflow where both nodes reach them: on the head's address.
    triton_ports = {name: env[f"INFERGATE_TRITON__{name}"]
                    for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT")}  # fmt: skip
    triton = subprocess.Popen(
        [str(BIN / "infergate"), "triton", "--address", gateway, "--state-dir",
         str(state_dir / "triton")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # MLflow started apart too, so that `infergate up` is the control plane alone, as the
    # chart runs it (and can be killed and started again as a pod would).
    mlflow_settings = MlflowSettings(
        host=gateway, port=int(env["INFERGATE_MLFLOW__PORT"]), store_dir=state_dir / "store"
    )
    mlflow_server_process = subprocess.Popen(
        mlflow_server.server_command(mlflow_settings),
        env=mlflow_server.server_environment(mlflow_settings, env),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    mlflow = mlflow_settings.uri
    serve_config = {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": cluster.http_port},
        "applications": [{
            "name": "infergate", "route_prefix": "/",
            "import_path": "infergate.serve_app:build_app",
            "args": {"triton_grpc_url": f"{gateway}:{triton_ports['GRPC_PORT']}",
                     "tracking_uri": mlflow, "artifact_cache_dir": str(state_dir / "cache")},
            # More than half a node's CPU each: one replica per node.
            "deployments": [{"name": "frontend", "num_replicas": 2,
                             "ray_actor_options": {"num_cpus": 0.6}}],
        }],
    }  # fmt: skip
    config_file = state_dir / "serve.yaml"
    config_file.write_text(yaml.safe_dump(serve_config))
    deployed = subprocess.run(
        [str(BIN / "serve"), "deploy", "--address", cluster.dashboard, str(config_file)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert deployed.returncode == 0, deployed.stderr[-2000:]
    env.update({
        "INFERGATE_SERVE__EXTERNAL": "true", "RAY_ADDRESS": cluster.client,
        "INFERGATE_TRITON__EXTERNAL_HOST": gateway, "INFERGATE_MLFLOW__TRACKING_URI": mlflow,
        "INFERGATE_PROMETHEUS__ENABLED": "false",
        "INFERGATE_SERVE__EXTERNAL_URL": f"http://{gateway}:{cluster.http_port}",
    })  # fmt: skip
    try:
        wait_for(lambda: _answers_health(mlflow), 120, "MLflow")
        with running_stack(state_dir, env) as running:
            folder = tiny_bert(state_dir / "source", "text-classification")
            registered = running.cli(
                "register", str(folder), "--name", MODEL, "--task", "text-classification",
                "--alias", "champion", "--quiet", "--tracking-uri", mlflow,
            )  # fmt: skip
            assert registered.returncode == 0, registered.stderr[-2000:]
            yield Stack(f"http://127.0.0.1:{cluster.http_port}", mlflow, running.admin,
                        running.env, running.state_dir)  # fmt: skip
    finally:
        stop_process(triton)
        stop_process(mlflow_server_process)


def _answers_health(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _predict(http: httpx.Client) -> httpx.Response:
    return http.post(f"/v1/models/{MODEL}/predict", json={"inputs": "good film"})


def test_replicas_on_both_nodes_serve_what_the_control_plane_publishes(cluster, stack):
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        wait_for(lambda: _predict(http).status_code == 200, 120, f"{MODEL} served")
    assert cluster.replica_nodes() == sorted([cluster.host.gateway, cluster.host.address])
    # What `up` prints as the inference address is the cluster's ingress, which answers.
    printed = json.loads((stack.state_dir / "stack.json").read_text())["inference"]
    assert printed == f"http://{cluster.host.gateway}:{cluster.http_port}"
    assert httpx.get(f"{printed}/readyz", timeout=10).status_code == 200
    # The worker node's own ingress answers too: the table reached its replica. The
    # head's first 200 may have come from the head's replica while the worker's was still
    # reading the version's files (it answers 503, "still loading", meanwhile).
    remote = f"http://{cluster.host.address}:{cluster.http_port}"
    with httpx.Client(base_url=remote, timeout=30) as http:
        response = wait_for(
            lambda: (answer := _predict(http)).status_code == 200 and answer, 60,
            "the worker node's ingress answering",
        )  # fmt: skip
    assert response.headers["x-model-version"] == "1"


def test_a_control_plane_restarted_mid_rollout_goes_on_with_it(stack):
    """`infergate up` is the control plane alone here, as in the chart. Killed (SIGKILL, as
    a lost pod) while an automatic rollout is at its first step, and started again: the
    replicas keep serving the table they had, and the new control plane picks the rollout
    up from the registry and its state folder and promotes the canary."""
    from mlflow import MlflowClient

    client = MlflowClient(stack.mlflow)
    policy = {"steps": "50,100", "step_interval_s": "6", "min_requests": "20",
              "latency_margin_ms": "50"}  # fmt: skip
    for key, value in policy.items():
        client.set_registered_model_tag(MODEL, f"infergate.rollout.policy.{key}", value)
    folder = tiny_bert(stack.state_dir / "same", "text-classification")  # the same weights
    registered = stack.cli(
        "register", str(folder), "--name", MODEL, "--task", "text-classification", "--quiet",
        "--tracking-uri", stack.mlflow,
    )  # fmt: skip
    assert registered.returncode == 0, registered.stderr[-2000:]
    canary = str(max(int(v.version) for v in client.search_model_versions(f"name='{MODEL}'")))
    champion = client.get_model_version_by_alias(MODEL, "champion").version
    versions: list[str | None] = []

    def send(http: httpx.Client) -> httpx.Response:
        answer = _predict(http)
        versions.append(answer.headers.get("x-model-version"))
        return answer

    with httpx.Client(base_url=stack.url, timeout=30) as http, Load(lambda: send(http)) as load:
        started = stack.cli("canary", "start", MODEL, "--version", canary, "--auto", "--no-shadow",
                            "--admin-url", stack.admin)  # fmt: skip
        assert started.returncode == 0, started.stderr
        wait_for(lambda: _weights(http).get(canary) == 50, 60, "the rollout's first step")
        at_kill = _rollout_tags(client)
        killed = time.monotonic()
        os.kill(_control_plane_pid(stack), signal.SIGKILL)
        time.sleep(2.0)  # the pod being replaced
        restarted = stack.cli("up", "--detach", timeout=300)
        assert restarted.returncode == 0, restarted.stderr[-3000:]
        up = time.monotonic()
        # It goes on from the step it was at: the same step, begun when it began (not
        # started afresh at 50 %), or the step after it if that one passed meanwhile.
        after = _rollout_tags(client)
        assert after.get("step") in (at_kill["step"], "1"), (at_kill, after)
        if after.get("step") == at_kill["step"]:
            assert after["step_started_at"] == at_kill["step_started_at"], (at_kill, after)
        wait_for(
            lambda: client.get_model_version_by_alias(MODEL, "champion").version == canary,
            120, "the canary promoted by the new control plane",
        )  # fmt: skip
        promoted = time.monotonic()
        time.sleep(1.0)
    statuses = sorted({status for _, _, status, _ in load.answers})
    print(
        f"\ncontrol plane killed at the rollout's first step: up again after {up - killed:.1f} s, "
        f"canary v{canary} promoted {promoted - up:.1f} s later; {len(load.answers)} requests, "
        f"statuses {statuses}, versions {sorted(set(versions), key=str)}"
    )
    assert statuses == [200]
    assert set(versions) <= {champion, canary}


def _serves(http: httpx.Client) -> bool:
    """Whether a prediction through ``http``'s ingress gets its 200 (an ingress not up
    yet refuses the connection)."""
    try:
        return _predict(http).status_code == 200
    except httpx.TransportError:
        return False


def _rollout_tags(client: Any) -> dict[str, str]:
    """The running rollout's state, as the registry keeps it (infergate.rollout.*)."""
    prefix = "infergate.rollout."
    tags = client.get_registered_model(MODEL).tags
    return {k[len(prefix) :]: v for k, v in tags.items() if k.startswith(prefix) and
            not k.startswith(prefix + "policy.")}  # fmt: skip


def _control_plane_pid(stack: Stack) -> int:
    return int(json.loads((stack.state_dir / "stack.json").read_text())["pid"])


def _weights(http: httpx.Client) -> dict[str, int]:
    described = http.get(f"/v1/models/{MODEL}").json()
    return {v["version"]: v["weight"] for v in described["versions"]}


def test_a_lost_worker_node_costs_no_request_and_gets_its_replica_back(cluster, stack):
    remote = f"http://{cluster.host.address}:{cluster.http_port}"  # the worker's ingress
    with httpx.Client(base_url=remote, timeout=30) as worker:
        # The worker's own ingress (which keeps requests on its node's replica) serves
        # before the loss: the node lost is one that was serving.
        wait_for(lambda: _serves(worker), 60, "the worker's ingress serving")
        assert {_predict(worker).status_code for _ in range(20)} == {200}
    with httpx.Client(base_url=stack.url, timeout=30) as http, Load(lambda: _predict(http)) as load:
        time.sleep(2.0)
        lost = time.monotonic()
        cluster.lose_worker()
        wait_for(lambda: cluster.replica_nodes() == [cluster.host.gateway], 60, "one replica left")
        cluster.start_worker()
        back = time.monotonic()
        wait_for(lambda: len(cluster.replica_nodes()) == 2, 60, "the second replica again")
        rescheduled = time.monotonic() - back
        # Back means serving: the new replica got the table, through its node's ingress.
        with httpx.Client(base_url=remote, timeout=30) as worker:
            wait_for(lambda: _serves(worker), 60, "the worker serving")
        serving = time.monotonic() - back
        time.sleep(2.0)
    after = [a for a in load.answers if a[0] >= lost]
    statuses = sorted({s for _, _, s, _ in after})
    slowest = max(duration for _, duration, _, _ in after)
    print(
        f"\nworker node lost under load: {len(after)} requests after it, statuses {statuses}, "
        f"slowest {slowest:.2f} s; node back after {back - lost:.1f} s, its replica "
        f"{rescheduled:.1f} s later, serving through its ingress {serving:.1f} s after it came"
    )
    assert statuses == [200] and slowest < 10.0
    assert cluster.replica_nodes() == sorted([cluster.host.gateway, cluster.host.address])
