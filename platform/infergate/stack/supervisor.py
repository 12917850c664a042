"""``infergate up``: the whole platform on one machine, as real processes.

MLflow server (SQLite + local artifact store), Triton (explicit model control), Ray Serve
(HAProxy ingress, front-end replicas), Prometheus when installed, and the control plane
(``infergate.control.service``) in this process. The supervisor starts MLflow, Triton and
Prometheus while Ray starts, waits for each to be ready, starts again a component that
exits (and gives up on one that keeps exiting), and stops them all on Ctrl-C or
``infergate down``.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from infergate.config import PROJECT_ROOT, ServeSettings, StackConfig
from infergate.control.service import ControlService, triton_repository
from infergate.errors import StackError
from infergate.registry import Registry
from infergate.serving.ingress import write_error_pages
from infergate.stack import mlflow_server
from infergate.stack.processes import (
    Child,
    check_ports,
    descendants,
    http_ok,
    reap,
    spawn,
    wait_until,
)
from infergate.stack.ray_start import grpc_message_limit, start_ray
from infergate.stack.state import STATE_FILE, write_state
from infergate.triton.client import TritonControl
from infergate.triton.fleet import TritonFleet
from infergate.triton.server import (
    find_tritonserver,
    prepare_backends,
    server_command,
    server_environment,
)

log = logging.getLogger(__name__)
RESTART_LIMIT = 3  # restarts of one component within RESTART_WINDOW_S before giving up
RESTART_WINDOW_S = 600.0
ERROR_PAGES_CHECK_S = 5.0  # how often the ingress's JSON error page is checked for
PROMETHEUS_TEMPLATE = PROJECT_ROOT / "deployments" / "prometheus.yml"


class Stack:
    def __init__(self, config: StackConfig) -> None:
        # MLflow's client retries with exponential backoff for minutes by default; a local
        # stack should fail (and say so) in seconds.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        # Before Ray starts: its workers inherit the credentials.
        mlflow_server.client_credentials(config.mlflow, os.environ)
        self.config = config
        self.state_dir = config.state_dir
        self.log_dir = config.state_dir / "logs"
        self.ingress_files = config.state_dir / "haproxy"  # its config and error pages
        self._pages_checked_at = float("-inf")
        self.children: list[Child] = []
        self.registry = Registry(config.mlflow.uri)
        self.control: ControlService | None = None
        self._serve_started = False
        self._restarts: dict[str, list[float]] = {}  # component -> when it was started again

    # -- start -------------------------------------------------------------------------

    def start(self) -> None:
        """Start every component. MLflow, Triton and Prometheus come up while Ray starts
        (each takes seconds; one after the other they were most of `up`'s time); the
        control plane starts once they all answer."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._check_ports()
        coming_up: list[Callable[[], None]] = []
        if self.config.mlflow.tracking_uri is None:
            coming_up.append(self._spawn_mlflow())
        if self.config.triton.external_host is None:
            coming_up.append(self._spawn_triton())
        coming_up.append(self._spawn_prometheus())
        self._start_serve()
        for wait in coming_up:
            wait()
        if self.config.triton.external_host is not None:
            self._wait_for_external_triton()
        self._start_control_plane()

    def _check_ports(self) -> None:
        c = self.config
        ports: dict[str, tuple[str, int, str]] = {}
        if c.triton.external_host is None:
            ports["Triton HTTP"] = ("127.0.0.1", c.triton.http_port, "INFERGATE_TRITON__HTTP_PORT")
            ports["Triton gRPC"] = ("127.0.0.1", c.triton.grpc_port, "INFERGATE_TRITON__GRPC_PORT")
            ports["Triton metrics"] = (
                "127.0.0.1",
                c.triton.metrics_port,
                "INFERGATE_TRITON__METRICS_PORT",
            )
        if not c.serve.external:
            ports["Ray Serve HTTP"] = (c.serve.host, c.serve.port, "INFERGATE_SERVE__PORT")
            ports["Ray metrics"] = (
                "127.0.0.1",
                c.serve.metrics_export_port,
                "INFERGATE_SERVE__METRICS_EXPORT_PORT",
            )
        if c.frontend.grpc_port and not c.serve.external:
            ports["Ray Serve gRPC"] = (
                c.serve.host,
                c.frontend.grpc_port,
                "INFERGATE_FRONTEND__GRPC_PORT",
            )
        if c.serve.fast_ingress and not c.serve.external:
            ports["HAProxy stats"] = (
                "0.0.0.0",
                c.serve.haproxy_stats_port,
                "INFERGATE_SERVE__HAPROXY_STATS_PORT",
            )
            ports["HAProxy metrics"] = (
                "0.0.0.0",
                c.serve.haproxy_metrics_port,
                "INFERGATE_SERVE__HAPROXY_METRICS_PORT",
            )
            ports["Ray Serve fallback proxy"] = (
                c.serve.host,
                c.serve.fallback_proxy_port,
                "INFERGATE_SERVE__FALLBACK_PROXY_PORT",
            )
        ports["admin API"] = (c.admin.host, c.admin.port, "INFERGATE_ADMIN__PORT")
        if c.mlflow.tracking_uri is None:
            ports["MLflow"] = (c.mlflow.host, c.mlflow.port, "INFERGATE_MLFLOW__PORT")
        if self._prometheus_binary():
            ports["Prometheus"] = ("127.0.0.1", c.prometheus.port, "INFERGATE_PROMETHEUS__PORT")
        check_ports(ports)

    # Each `_spawn_X` starts X's process and returns what waits until it answers; `_start_X`
    # does both (a restart).

    def _start_mlflow(self) -> None:
        self._spawn_mlflow()()

    def _start_triton(self) -> None:
        self._spawn_triton()()

    def _start_prometheus(self) -> None:
        self._spawn_prometheus()()

    def _spawn_mlflow(self) -> Callable[[], None]:
        m = self.config.mlflow
        env = mlflow_server.server_environment(m, os.environ)
        child = self._spawn("mlflow", mlflow_server.server_command(m), env)
        return lambda: wait_until(
            child, lambda: http_ok(f"{m.uri}/health"), m.startup_timeout_s, "MLflow"
        )

    def _spawn_triton(self) -> Callable[[], None]:
        t = self.config.triton
        install = find_tritonserver()
        repository = triton_repository(self.config)
        assert repository is not None
        # Versions are loaded explicitly by the control plane; start from an empty repository.
        shutil.rmtree(repository, ignore_errors=True)
        repository.mkdir(parents=True)
        backends = prepare_backends(self.state_dir)
        command = server_command(t, repository, backends, install=install)
        child = self._spawn("triton", command, server_environment(os.environ, install=install))

        def wait() -> None:
            control = TritonControl(t.grpc_url)
            try:
                wait_until(child, control.server_ready, t.startup_timeout_s, "Triton")
            finally:
                control.close()

        return wait

    def _wait_for_external_triton(self) -> None:
        """A Triton the stack does not start: wait until every address answers."""
        t = self.config.triton
        fleet = TritonFleet(t, None)
        try:
            wait_until(None, fleet.ready, t.startup_timeout_s, f"Triton at {t.host}")
        finally:
            fleet.close()

    def _start_serve(self) -> None:
        start_ray(
            self.config.serve,
            keep={child.popen.pid for child in self.children},
            ingress_files=self.ingress_files,
            grpc_port=self.config.frontend.grpc_port,
            grpc_max_message_bytes=grpc_message_limit(self.config.frontend.max_body_bytes),
        )
        self._serve_started = True

    def _start_control_plane(self) -> None:
        self.control = ControlService(self.config, self.registry)
        self.control.start()

    def _prometheus_binary(self) -> str | None:
        p = self.config.prometheus
        return shutil.which(p.binary) if p.enabled else None

    def _spawn_prometheus(self) -> Callable[[], None]:
        binary = self._prometheus_binary()
        if binary is None:
            log.warning("Prometheus is not installed; the platform runs without it")
            return lambda: None
        p, c = self.config.prometheus, self.config
        config_file = self.state_dir / "prometheus.yml"
        config_file.write_text(render_prometheus_config(c))
        # rule_files are resolved beside the rendered config.
        shutil.copy(PROJECT_ROOT / "deployments" / "alerts.yml", self.state_dir / "alerts.yml")
        command = [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={self.state_dir / 'prometheus'}",
            f"--web.listen-address=127.0.0.1:{p.port}",
        ]
        child = self._spawn("prometheus", command, dict(os.environ))
        ready = f"http://127.0.0.1:{p.port}/-/ready"
        return lambda: wait_until(child, lambda: http_ok(ready), 30, "Prometheus")

    def _spawn(self, name: str, command: list[str], env: dict[str, str]) -> Child:
        child = spawn(name, command, self.log_dir, env)
        self.children.append(child)
        return child

    # -- run ---------------------------------------------------------------------------

    def wait_serving(self, timeout_s: float = 120.0) -> None:
        """Until /readyz answers 200: every served version answers through the front-end.

        Not with ``serve.external``: the ingress is the cluster's (KubeRay's Service), at an
        address this process is not told, and every replica having adopted the table,
        which publishing it waits for, is what readiness means here."""
        s = self.config.serve
        if s.external:
            return
        url = f"http://{s.host}:{s.port}/readyz"
        wait_until(None, lambda: http_ok(url), timeout_s, "the front-end")

    def endpoints(self) -> dict[str, Any]:
        c = self.config
        served = self.control.serving if self.control else {}
        endpoints = {
            "pid": os.getpid(),
            "inference": inference_address(c.serve),
            "inference_grpc": grpc_address(c),
            "admin": c.admin.url,
            "mlflow": c.mlflow.uri,
            "triton_grpc": c.triton.grpc_url,
            "triton_metrics": f"http://{c.triton.host}:{c.triton.metrics_port}/metrics",
            "models": sorted(f"{v.name} v{v.version}" for v in served.values()),
            "logs": str(self.log_dir),
        }
        if any(child.name == "prometheus" for child in self.children):
            endpoints["prometheus"] = f"http://127.0.0.1:{c.prometheus.port}"
        if self._serve_started and not c.serve.external:
            import ray

            # For `ray status --address` and Ray clients (the benchmark deploys into it).
            endpoints["ray"] = ray.get_runtime_context().gcs_address
        return endpoints

    def write_state(self) -> None:
        write_state(self.state_dir, self.endpoints())

    def watch(self, stop_requested: list[bool]) -> None:
        """Block until asked to stop: run the control plane's rounds, and start again a
        component that exited (raise if one keeps exiting)."""
        assert self.control is not None
        while not stop_requested:
            self.control.run_due()
            if self._serve_started and self.config.serve.fast_ingress:
                now = time.monotonic()
                if now >= self._pages_checked_at + ERROR_PAGES_CHECK_S:
                    self._pages_checked_at = now
                    # Ray Serve writes its own again when its proxy restarts.
                    write_error_pages(self.ingress_files)
            for child in [c for c in self.children if not c.alive()]:
                self._start_again(child)
            self.control.wait(0.5)

    def _start_again(self, child: Child) -> None:
        """Start a component that exited, as a supervisor would (requests meanwhile get
        503s, not refused connections); after RESTART_LIMIT restarts of it within
        RESTART_WINDOW_S, stop the stack instead."""
        now = time.monotonic()
        recent = [t for t in self._restarts.get(child.name, []) if now - t < RESTART_WINDOW_S]
        exited = (
            f"{child.name} exited with code {child.popen.returncode}; "
            f"last lines of {child.log_path}:\n{child.log_tail()}"
        )
        if len(recent) >= RESTART_LIMIT:
            raise StackError(
                f"{exited}\nit was started again {len(recent)} times in the last "
                f"{RESTART_WINDOW_S:.0f} s; giving up"
            )
        self._restarts[child.name] = [*recent, now]
        log.error("%s\nstarting %s again", exited, child.name)
        child.stop()  # what is left of its process group
        self.children.remove(child)
        start = {
            "mlflow": self._start_mlflow,
            "triton": self._start_triton,
            "prometheus": self._start_prometheus,
        }[child.name]
        if self.control is None:  # still starting
            start()
        else:
            with self.control.lock:  # no reconcile or command meanwhile
                start()
                if child.name == "triton":  # it came back empty
                    self.control.triton_restarted()
        log.info("%s runs again", child.name)

    # -- stop --------------------------------------------------------------------------

    def stop(self) -> None:
        if self.control is not None:
            self.control.stop()
        try:
            if self._serve_started and not self.config.serve.external:
                from ray import serve

                # The replicas finish their requests first, with Triton still answering.
                # (KubeRay owns an external Serve app.)
                serve.shutdown()
        finally:
            for child in self.children:  # all at once, and while Ray shuts down
                child.terminate()
            if self._serve_started:
                import ray

                ray.shutdown()
                self._serve_started = False
        for child in self.children:
            child.stop()
        self.children.clear()
        # What is left below us is Ray's: ray.shutdown() returns before its agents exit,
        # and they would hold their ports (and memory) for a while as orphans.
        reap(descendants([os.getpid()]))
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)


def render_prometheus_config(config: StackConfig) -> str:
    """deployments/prometheus.yml with this stack's ports filled in."""
    text = PROMETHEUS_TEMPLATE.read_text()
    values = {
        "TRITON_METRICS": f"{config.triton.host}:{config.triton.metrics_port}",
        "RAY_METRICS": f"127.0.0.1:{config.serve.metrics_export_port}",
        "HAPROXY_METRICS": f"127.0.0.1:{config.serve.haproxy_metrics_port}",
    }
    for key, value in values.items():
        text = text.replace("${" + key + "}", value)
    return text


def inference_address(serve: ServeSettings) -> str:
    """Where clients call the front-end: this stack's ingress, or with ``serve.external``
    the cluster's, which only ``serve.external_url`` can tell (no ingress listens here)."""
    if not serve.external:
        return f"http://{serve.host}:{serve.port}"
    return serve.external_url or "the Ray cluster's Serve ingress (set serve.external_url)"


def grpc_address(config: StackConfig) -> str:
    """Where gRPC clients (``tritonclient.grpc``) call the front-end, if anywhere here."""
    if not config.frontend.grpc_port:
        return "off (frontend.grpc_port is 0)"
    if config.serve.external:
        return "the Ray cluster's Serve gRPC ingress"
    return f"{config.serve.host}:{config.frontend.grpc_port}"
