"""The front-end on a Ray cluster the platform did not start: a head on this machine and a
worker node on another "host" (a network namespace with its own address), as an operator
runs them (`ray start`), the Serve application deployed declaratively (`serve deploy`, as
KubeRay does), Triton and MLflow reachable from both nodes, and `infergate up` joining with
serve.external to publish traffic tables. The replicas run on both nodes; the worker node
lost under load, with the ControlState actor on the head or on the worker itself, costs no
request and no control: a rollout under way goes on, its next table reaches both nodes, and
the worker, back, gets its replica again with that table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import Load, Stack, running_stack, stack_env, wait_for
from ray_nodes import BIN, RAY_ENV, Cluster, control_plane_pid, place_control_actor

from infergate.config import MlflowSettings
from infergate.stack import mlflow_server
from infergate.stack.processes import descendants, free_ports, reap
from network_hosts import network_host, unavailable
from tiny_models import tiny_bert
from triton_process import stop_process

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.machine("netns", unavailable()),
]
MODEL = "spread"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("ray-cluster")
    env = {**os.environ, **RAY_ENV}
    with network_host(f"igr{os.getpid() % 10000}") as host:
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
    head_node = cluster.node_id(gateway)
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
        # The ControlState actor on the head (a soft preference for its node's labels).
        "INFERGATE_SERVE__CONTROL_ACTOR_LABELS": json.dumps({"ray.io/node-id": head_node}),
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


def test_a_batch_job_on_the_cluster_runs_its_parts_on_both_nodes(cluster, stack, tmp_path):
    """`infergate batch` with RAY_ADDRESS naming the cluster: its actors are sized from
    each node's free CPUs (0.4 on each, beside a replica of 0.6), so one runs on each
    node; every part is written, the rows by node (the job's figures and its MLflow run)
    name both nodes, and the answers equal the online endpoint's."""
    from mlflow import MlflowClient

    texts = [f"{word} film number {i}" for i in range(24) for word in ("good", "bad")]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "out"
    env = {**cluster.env, "RAY_ADDRESS": cluster.gcs}
    done = subprocess.run(
        [str(BIN / "infergate"), "batch", MODEL, str(source), str(out), "--part-bytes", "400",
         "--tracking-uri", stack.mlflow, "--state-dir", str(stack.state_dir)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.splitlines()[-1])
    assert figures["rows"] == len(texts) and figures["errors"] == 0
    assert figures["actors"] == 2 and figures["parts"] >= 4
    nodes = sorted([cluster.host.gateway, cluster.host.address])
    assert sorted(figures["rows_by_node"]) == nodes, figures
    assert all(rows > 0 for rows in figures["rows_by_node"].values())
    run = MlflowClient(stack.mlflow).get_run(figures["run_id"])
    assert run.data.metrics["nodes"] == 2
    assert json.loads(run.data.tags["rows_by_node"]) == figures["rows_by_node"]
    rows = sorted(
        (
            json.loads(line)
            for part in out.glob("part-*.jsonl")
            for line in part.read_text().splitlines()
        ),
        key=lambda row: row["id"],
    )
    assert [row["text"] for row in rows] == texts
    answers = []
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        for start in range(0, len(texts), 8):
            online = http.post(
                f"/v1/models/{MODEL}/predict", json={"inputs": texts[start : start + 8]}
            )
            assert online.status_code == 200, online.text
            answers += online.json()["outputs"]
    for row, answer in zip(rows, answers, strict=True):
        for key, value in answer.items():
            if isinstance(value, float):
                assert abs(row[key] - value) < 2e-3, (key, row, answer)
            else:
                assert row[key] == value, (key, row, answer)


def test_a_control_plane_restarted_mid_rollout_goes_on_with_it(stack):
    """`infergate up` is the control plane alone here, as in the chart. Killed (SIGKILL, as
    a lost pod) while an automatic rollout is at its first step, and started again: the
    replicas keep serving the table they had, and the new control plane resumes the rollout
    from the registry and its state folder (the step it was at, begun when it began; not a
    rollout started afresh) and promotes the canary."""
    from mlflow import MlflowClient

    client = MlflowClient(stack.mlflow)
    policy = {"steps": "50,100", "step_interval_s": "10", "min_requests": "20",
              "latency_margin_ms": "50"}  # fmt: skip
    for key, value in policy.items():
        client.set_registered_model_tag(MODEL, f"infergate.rollout.policy.{key}", value)
    folder = tiny_bert(stack.state_dir / "same", "text-classification")  # the same weights
    stack.register(folder, MODEL, "text-classification")
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
        assert at_kill["step"] == "0" and at_kill["canary_version"] == canary, at_kill
        watch = _RolloutWatch(stack.mlflow)
        watch.start()
        killed = time.monotonic()
        os.kill(control_plane_pid(stack), signal.SIGKILL)
        time.sleep(2.0)  # the pod being replaced
        restarted = stack.cli("up", "--detach", timeout=300)
        assert restarted.returncode == 0, restarted.stderr[-3000:]
        up = time.monotonic()
        wait_for(
            lambda: client.get_model_version_by_alias(MODEL, "champion").version == canary,
            120, "the canary promoted by the new control plane",
        )  # fmt: skip
        promoted = time.monotonic()
        watch.stop()
        time.sleep(1.0)
    # Resumed, not restarted: from the kill to the promotion the registry held the step it
    # was at with its start time, then the next step, never a first step begun afresh (a
    # step lasts 10 s; the watch reads the registry four times a second).
    steps = [(state.get("step"), state.get("step_started_at")) for state in watch.states]
    first = (at_kill["step"], at_kill["step_started_at"])
    assert steps[0] == first and "1" in {step for step, _ in steps}, steps
    assert all(state == first for state in steps if state[0] == "0"), steps  # never afresh
    statuses = sorted({status for _, _, status, _ in load.answers})
    print(
        f"\ncontrol plane killed at the rollout's first step: up again after {up - killed:.1f} s, "
        f"the rollout resumed (registry states from the kill on: {steps}); canary v{canary} "
        f"promoted {promoted - up:.1f} s later; {len(load.answers)} requests, "
        f"statuses {statuses}, versions {sorted(set(versions), key=str)}"
    )
    assert statuses == [200]
    assert set(versions) <= {champion, canary}


class _RolloutWatch(threading.Thread):
    """The rollout's state in the registry four times a second, each change recorded."""

    def __init__(self, mlflow: str) -> None:
        super().__init__(daemon=True)
        from mlflow import MlflowClient

        self._client = MlflowClient(mlflow)
        self._done = threading.Event()
        self.states: list[dict[str, str]] = []

    def run(self) -> None:
        while not self._done.is_set():
            state = _rollout_tags(self._client)
            if not self.states or state != self.states[-1]:
                self.states.append(state)
            time.sleep(0.25)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=30)


def _serves(http: httpx.Client) -> bool:
    """Whether a prediction through ``http``'s ingress gets its 200 (or it is not up)."""
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


def _weights(http: httpx.Client) -> dict[str, int]:
    described = http.get(f"/v1/models/{MODEL}").json()
    return {v["version"]: v["weight"] for v in described["versions"]}


def _start_rollout(stack: Stack, client: Any) -> str:
    """An automatic rollout of a new version (the same weights) with short steps; its
    version. Latency is not what is judged here: a node lost on a loaded machine slowed the
    canary's few requests (p95 1.96x the champion's) and rolled it back."""
    policy = {"steps": "20,50,100", "step_interval_s": "10", "min_requests": "20",
              "latency_margin_ms": "1000", "max_latency_ratio": "10"}  # fmt: skip
    for key, value in policy.items():
        client.set_registered_model_tag(MODEL, f"infergate.rollout.policy.{key}", value)
    stack.register(tiny_bert(stack.state_dir / "same", "text-classification"), MODEL,
                   "text-classification")  # fmt: skip
    canary = str(max(int(v.version) for v in client.search_model_versions(f"name='{MODEL}'")))
    started = stack.cli("canary", "start", MODEL, "--version", canary, "--auto", "--no-shadow",
                        "--admin-url", stack.admin)  # fmt: skip
    assert started.returncode == 0, started.stderr
    return canary


def _weights_or_none(http: httpx.Client) -> dict[str, int] | None:
    try:
        return _weights(http)
    except (httpx.HTTPError, ValueError, KeyError):  # an ingress down or still loading
        return None


@pytest.mark.parametrize("actor_on", ["worker", "head"])
def test_a_lost_worker_node_costs_no_request_and_no_control(cluster, stack, actor_on):
    """The worker node, serving through its own ingress, lost under load on both nodes'
    ingresses while a rollout is at its first step, with the ControlState actor on the head
    or on the worker itself (the worst case: Ray restarts it on the head, empty, and the
    control plane publishes its table again). No request through the head fails; the
    rollout goes on (a table change made after the loss reaches the head's replica, and
    the worker's new replica once back) up to promotion."""
    from mlflow import MlflowClient

    head, worker_ip = cluster.host.gateway, cluster.host.address
    place_control_actor(cluster, stack, head if actor_on == "head" else worker_ip)
    placed = cluster.control_actor()
    assert placed is not None
    restarts = placed[1]
    client = MlflowClient(stack.mlflow)
    remote = f"http://{worker_ip}:{cluster.http_port}"  # the worker's ingress
    with httpx.Client(base_url=stack.url, timeout=30) as http, \
            httpx.Client(base_url=remote, timeout=30) as worker:  # fmt: skip
        wait_for(lambda: _serves(worker), 120, "the worker's ingress serving")
        canary = _start_rollout(stack, client)
        at_first_step = wait_for(lambda: (w := _weights(http)).get(canary) == 20 and w, 120,
                                 "the rollout's first step on the head")  # fmt: skip
        wait_for(lambda: _weights(worker) == at_first_step, 60, "it on the worker")
        with Load(lambda: _predict(http)) as load, Load(lambda: _predict(http)) as load_2, \
                Load(lambda: _predict(worker)) as on_worker:  # fmt: skip
            time.sleep(2.0)
            at_loss = _rollout_tags(client)
            assert at_loss["step"] == "0", at_loss
            lost, lost_wall = time.monotonic(), time.time()
            cluster.lose_worker()
            if actor_on == "worker":  # Ray restarts it on the head (it answers once alive)
                wait_for(lambda: (a := cluster.control_actor()) and a[0] == head, 120,
                         "the ControlState actor alive on the head")  # fmt: skip
                actor_back = f"{time.monotonic() - lost:.1f} s"
            else:
                actor_back = "never away"
            now = cluster.control_actor()
            assert now is not None and now[0] == head
            assert now[1] == restarts + (actor_on == "worker"), (placed, now)
            # A table change made after the loss: the rollout's next step, on the head.
            changed = wait_for(lambda: (w := _weights_or_none(http)) and w.get(canary, 0) > 20
                               and w, 180, "the rollout's next step on the head")  # fmt: skip
            changed_wall = time.time()
            after_tags = _rollout_tags(client)
            # Not a rollback. The tag holds the latest decision only: once the rollout
            # advanced, the next round may already have judged the new step too young
            # ("wait"), as a clean-clone run read.
            assert after_tags.get("last_decision") in ("advance", "wait"), after_tags
            assert int(after_tags["step"]) > int(at_loss["step"]), (at_loss, after_tags)
            step_began = float(after_tags["step_started_at"])
            assert step_began > lost_wall, (at_loss, after_tags)
            wait_for(lambda: cluster.replica_nodes() == [head], 60, "one replica left")
            cluster.start_worker()
            back = time.monotonic()
            # Back means serving the current table: the worker's new replica has only the
            # (restarted) actor to get it from.
            wait_for(lambda: (w := _weights_or_none(worker)) is not None
                     and w == _weights_or_none(http) and w != at_first_step, 120,
                     "the worker's new replica serving the current table")  # fmt: skip
            worker_current = time.monotonic() - back
            wait_for(lambda: client.get_model_version_by_alias(MODEL, "champion").version
                     == canary, 180, "the canary promoted")  # fmt: skip
            time.sleep(1.0)
    after = [a for a in load.answers + load_2.answers if a[0] >= lost]
    failed = sum(status != 200 for _, _, status, _ in after)
    slowest = max(duration for _, duration, _, _ in after)
    served_before = sum(s == 200 for sent, _, s, _ in on_worker.answers if sent < lost)
    served_after = sum(s == 200 for sent, _, s, _ in on_worker.answers if sent >= back)
    print(
        f"\nworker node lost (ControlState actor on the {actor_on}): {len(after)} requests "
        f"through the head after it, {failed} failed, slowest {slowest:.2f} s; the worker's "
        f"ingress served {served_before} before the loss; actor answering again: {actor_back}; "
        f"the rollout's next step ({changed}) made {step_began - lost_wall:.1f} s after the "
        f"loss, served by the head's replica {changed_wall - step_began:.1f} s after it was "
        f"made; node back after {back - lost:.1f} s, its new replica serving the current "
        f"table {worker_current:.1f} s after that ({served_after} answers through its ingress "
        f"since); canary v{canary} promoted"
    )
    assert failed == 0 and slowest < 10.0, load.failures
    assert served_before > 0 and served_after > 0
    assert cluster.replica_nodes() == sorted([head, worker_ip])
