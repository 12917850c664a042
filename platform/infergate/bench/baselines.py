"""The baselines infergate is measured against, each one process (and its descendants)
the harness spawns on free loopback ports: the same front-end with ONNX Runtime in the
replica, the Ray Serve floor, Triton's own ensemble, and the naive FastAPI server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson

from infergate.bench.ensemble import ENSEMBLE_MODEL, TEXT_INPUT, write_ensemble_repository
from infergate.bench.loadgen import HttpTarget
from infergate.bench.prepare import MODEL_NAME
from infergate.bench.scenarios import HOST, START_TIMEOUT_S, Scenario, reap_session
from infergate.config import load_config
from infergate.stack.processes import Child, free_ports, http_ok, spawn, wait_until

# naive_server's environment variables (that module loads torch when imported).
NAIVE_MODEL_ENV = "BENCH_NAIVE_MODEL_DIR"
NAIVE_THREADS_ENV = "BENCH_NAIVE_THREADS"
NAIVE_INT8_ENV = "BENCH_NAIVE_INT8"


class _ChildScenario(Scenario):
    """A scenario that is one child process (and its descendants)."""

    child: Child | None = None

    def roots(self) -> list[int]:
        return [self.child.popen.pid] if self.child else []

    def stop(self) -> None:
        if self.child is None:
            return
        # The main process first, so it can stop what it started in order (Ray), then
        # whatever is left of its session: Ray's dashboard and runtime-env agents were seen
        # to outlive an orderly ray.shutdown().
        pid = self.child.popen.pid
        if self.child.alive():
            os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.popen.wait(timeout=60)
        self.child.stop(timeout_s=15)
        self.child = None
        self.info["leftover_processes"] = reap_session(pid)

    def log_tail(self) -> str:
        return self.child.log_tail(30) if self.child else ""


class InprocessServe(_ChildScenario):
    """The same Ray Serve front-end with ONNX Runtime in the replica (no Triton)."""

    name = "inprocess"
    description = "infergate without Triton: HAProxy -> Ray Serve front-end with ONNX Runtime"
    path = f"/v1/models/{MODEL_NAME}/predict"
    extra_args: tuple[str, ...] = ()
    ready_path = "/readyz"

    def start(self) -> None:
        self.port, stats_port, haproxy_metrics_port, metrics_port = free_ports(4)
        command = [
            sys.executable,
            "-m",
            "infergate.bench.inprocess_server",
            f"--served-dir={self.prepared.served_dir}",
            f"--version={self.prepared.version}",
            f"--port={self.port}",
            f"--haproxy-stats-port={stats_port}",
            f"--haproxy-metrics-port={haproxy_metrics_port}",
            f"--metrics-export-port={metrics_port}",
            *self.extra_args,
        ]
        self.child = spawn(self.name, command, self.workdir / "logs", dict(os.environ))
        url = f"http://{HOST}:{self.port}{self.ready_path}"
        wait_until(
            self.child, lambda: http_ok(url, timeout_s=5), START_TIMEOUT_S, "the in-process app"
        )


class FloorServe(InprocessServe):
    """Ray Serve's fast ingress and a replica that parses and answers, nothing more."""

    name = "floor"
    description = "floor: HAProxy -> Ray Serve replica answering without tokenizing or inferring"
    extra_args = ("--floor",)
    ready_path = "/-/healthz"  # Ray Serve: 200 once a replica of the app is up

    def paced_target(self, bodies: Sequence[bytes], delay_ms: float) -> HttpTarget:
        return replace(self.target(bodies), path=f"{self.path}?delay_ms={delay_ms:.3f}")


class NaiveServer(_ChildScenario):
    """FastAPI + transformers + PyTorch fp32 under ``uvicorn --workers <cores>``, each
    worker with its share of the cores as PyTorch threads."""

    name = "naive"
    description = (
        "naive: FastAPI + transformers + PyTorch fp32, uvicorn, one worker per core, "
        "one PyTorch thread each"
    )
    path = f"/v1/models/{MODEL_NAME}/predict"
    int8 = False

    def start(self) -> None:
        [self.port] = free_ports(1)
        cores = os.cpu_count() or 1
        workers, threads = cores, 1
        self.info.update(
            workers=workers, threads_per_worker=threads, int8=self.int8,
            model_dir=str(self.prepared.hf_dir),
        )  # fmt: skip
        command = [
            str(Path(sys.executable).with_name("uvicorn")),
            "infergate.bench.naive_server:app",
            f"--host={HOST}",
            f"--port={self.port}",
            f"--workers={workers}",
            "--no-access-log",
        ]
        env = {**os.environ, NAIVE_MODEL_ENV: str(self.prepared.hf_dir), "HF_HUB_OFFLINE": "1",
               NAIVE_THREADS_ENV: str(threads)}  # fmt: skip
        if self.int8:
            env[NAIVE_INT8_ENV] = "1"
        self.child = spawn(self.name, command, self.workdir / "logs", env)
        log_path = self.child.log_path

        def all_workers_up() -> bool:
            # One line per worker; /healthz alone could be answered by the first one up.
            return log_path.read_text().count("Application startup complete") >= workers

        wait_until(self.child, all_workers_up, START_TIMEOUT_S, "the naive server")


class NaiveInt8Server(NaiveServer):
    """The naive server with PyTorch's dynamic int8 quantisation of its Linear layers."""

    name = "naive-int8"
    description = "naive int8: the naive server, its Linear layers quantised by PyTorch (dynamic)"
    int8 = True


class EnsembleTriton(_ChildScenario):
    """Triton alone: tokenizer (Python model) -> model, chained in an ensemble."""

    name = "ensemble"
    description = "Triton ensemble: KServe v2 HTTP -> tokenizer Python model -> model"
    path = f"/v2/models/{ENSEMBLE_MODEL}/infer"

    def start(self) -> None:
        from infergate.triton.client import TritonControl
        from infergate.triton.server import (
            prepare_backends,
            server_command,
            server_environment,
        )

        http_port, grpc_port, metrics_port = free_ports(3)
        settings = load_config().triton.model_copy(
            update={"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
        )
        self.port = settings.http_port
        self.triton_metrics_url = f"http://{HOST}:{settings.metrics_port}/metrics"
        repository = self.workdir / "repository"
        repository.mkdir(parents=True)
        models = write_ensemble_repository(
            repository,
            onnx_path=self.prepared.onnx_path,
            tokenizer_dir=self.prepared.tokenizer_dir,
            spec=self.prepared.spec,
            settings=settings,
            model_name=MODEL_NAME,
            version=self.prepared.version,
        )
        command = server_command(settings, repository, prepare_backends(self.workdir))
        self.child = spawn(
            self.name, command, self.workdir / "logs", server_environment(os.environ)
        )
        control = TritonControl(settings.grpc_url)
        try:
            wait_until(self.child, control.server_ready, settings.startup_timeout_s, "Triton")
            for model in models:  # composing models first, then the ensemble
                control.load(model, settings.load_timeout_s)
        finally:
            control.close()
        self.info["models"] = models

    def body(self, texts: Sequence[str]) -> bytes:
        request = {
            "inputs": [
                {
                    "name": TEXT_INPUT,
                    "shape": [len(texts), 1],
                    "datatype": "BYTES",
                    "data": list(texts),
                }
            ],
            "outputs": [{"name": self.prepared.spec["output_name"]}],
        }
        return orjson.dumps(request)

    def labels(self, answer: bytes) -> list[str]:
        output = orjson.loads(answer)["outputs"][0]
        logits = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
        labels = self.prepared.labels
        return [labels[i] if labels else str(i) for i in logits.argmax(axis=-1).tolist()]
