"""Start and stop each scenario's processes on free loopback ports, and say how to talk to it.

Every scenario serves the prepared ``sentiment`` model (``infergate.bench.prepare``) and is
one process tree the harness started, so its memory and CPU can be read from ``/proc``.
The ceiling is not here: it has no server (``infergate.bench.ceiling``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from infergate.bench import procfs
from infergate.bench.ensemble import ENSEMBLE_MODEL, TEXT_INPUT, write_ensemble_repository
from infergate.bench.loadgen import HttpTarget, percentile, run_sync, send_once
from infergate.bench.prepare import MODEL_NAME, PreparedModel, sha256
from infergate.bench.workload import Profile, TextSets
from infergate.config import load_config
from infergate.errors import StackError
from infergate.processes import Child, free_ports, http_ok, reap, spawn, wait_until
from infergate.tokenization import TextTokenizer
from infergate.triton.client import TritonBackend
from infergate.versions import triton_model_name

HOST = "127.0.0.1"
INFERGATE = str(Path(sys.executable).with_name("infergate"))
START_TIMEOUT_S = 600.0  # the whole stack: MLflow, Triton, Ray Serve, Prometheus
STOP_TIMEOUT_S = 120.0
NAIVE_MODEL_ENV = "BENCH_NAIVE_MODEL_DIR"  # naive_server.MODEL_ENV (that module loads torch)
# Every port of `infergate up`, moved to free ones so a developer's stack can keep running.
STACK_PORTS = (
    "MLFLOW__PORT",
    "TRITON__HTTP_PORT",
    "TRITON__GRPC_PORT",
    "TRITON__METRICS_PORT",
    "SERVE__PORT",
    "SERVE__METRICS_EXPORT_PORT",
    "SERVE__HAPROXY_STATS_PORT",
    "SERVE__HAPROXY_METRICS_PORT",
    "PROMETHEUS__PORT",
    "ADMIN__PORT",
)


def infergate_body(texts: Sequence[str]) -> bytes:
    return orjson.dumps({"inputs": list(texts)})


def infergate_labels(answer: bytes) -> list[str]:
    return [output["label"] for output in orjson.loads(answer)["outputs"]]


class Scenario(ABC):
    """One way of serving the model, measured over HTTP."""

    name: str
    description: str
    path: str

    def __init__(self, prepared: PreparedModel, workdir: Path) -> None:
        self.prepared = prepared
        self.workdir = workdir
        self.port = 0
        self.info: dict[str, Any] = {}
        self.triton_metrics_url: str | None = None  # set by scenarios that run Triton

    @abstractmethod
    def start(self) -> None:
        """Start the processes and return once a request would be answered."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every process started by :meth:`start`."""

    @abstractmethod
    def roots(self) -> list[int]:
        """The pids whose process trees make up the scenario."""

    def body(self, texts: Sequence[str]) -> bytes:
        """A request body holding ``texts``."""
        return infergate_body(texts)

    def labels(self, answer: bytes) -> list[str]:
        """The predicted labels in an answer to :meth:`body`."""
        return infergate_labels(answer)

    def target(self, bodies: Sequence[bytes]) -> HttpTarget:
        return HttpTarget(HOST, self.port, self.path, tuple(bodies))

    def log_tail(self) -> str:
        return ""

    def triton_alone(self, texts: TextSets, profile: Profile) -> list[dict[str, Any]]:
        """Its Triton called straight, per token length (scenarios that run one)."""
        return []

    def paced_target(self, bodies: Sequence[bytes], delay_ms: float) -> HttpTarget | None:
        """A target whose every answer waits ``delay_ms`` first (scenarios that can)."""
        return None


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


async def sequential_calls(
    backend: TritonBackend,
    model: str,
    output: str,
    requests: Sequence[tuple[np.ndarray, np.ndarray]],
    warmup_s: float,
    duration_s: float,
) -> dict[str, Any]:
    """Call ``model`` with one (input_ids, attention_mask) of ``requests`` after another,
    in turn, for ``warmup_s`` then ``duration_s``; the calls of the second part timed.
    The channel is closed at the end, inside the loop that opened it."""
    if not requests:
        raise ValueError("no requests to send")
    latencies: list[float] = []
    try:
        measure_from = time.perf_counter() + warmup_s
        stop_at = measure_from + duration_s
        calls = 0
        while (now := time.perf_counter()) < stop_at:
            await backend.infer(model, *requests[calls % len(requests)], output)
            calls += 1
            if now >= measure_from:
                latencies.append((time.perf_counter() - now) * 1e3)
    finally:
        await backend.close()
    ordered = sorted(latencies)
    return {"calls": len(ordered), **{f"p{q}_ms": percentile(ordered, q) for q in (50, 95, 99)}}


def reap_session(session: int, grace_s: float = 10.0, settle_s: float = 3.0) -> int:
    """SIGTERM, then SIGKILL after ``grace_s``, every process still in ``session`` after
    ``settle_s`` (helpers such as multiprocessing's resource tracker leave on their own a
    moment after their parent); returns how many were left."""
    deadline = time.monotonic() + settle_s
    while procfs.session_members(session) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftovers = procfs.session_members(session)
    reap(leftovers, timeout_s=grace_s)
    return len(leftovers)


class InfergateStack(Scenario):
    """The real platform: ``infergate up --detach`` on a copy of the prepared registry."""

    name = "infergate"
    description = "infergate end to end: HAProxy -> Ray Serve front-end -> gRPC -> Triton"
    path = f"/v1/models/{MODEL_NAME}/predict"

    def __init__(
        self,
        prepared: PreparedModel,
        workdir: Path,
        extra_env: dict[str, str] | None = None,
        label: str | None = None,
    ) -> None:
        """``extra_env`` (settings such as ``INFERGATE_TRITON__INSTANCE_COUNT``) makes this
        a variant, named ``infergate (label)``."""
        super().__init__(prepared, workdir)
        self.state_dir = workdir / "stack"
        self.pid: int | None = None
        self.env: dict[str, str] = {}
        self.extra_env = dict(extra_env or {})
        self.triton_model = triton_model_name(MODEL_NAME, prepared.version)
        if label:
            self.name = f"infergate ({label})"
            self.description += " with " + ", ".join(f"{k}={v}" for k, v in self.extra_env.items())

    def _cli(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        command = [INFERGATE, *args, "--state-dir", str(self.state_dir)]
        return subprocess.run(
            command, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def start(self) -> None:
        self.state_dir.mkdir(parents=True)
        # A copy: the stack writes to its store (webhooks), the cache must stay as built.
        shutil.copytree(self.prepared.store_dir, self.state_dir / "store")
        env = {**os.environ, **self.extra_env, "HF_HUB_OFFLINE": "1"}
        for name, port in zip(STACK_PORTS, free_ports(len(STACK_PORTS)), strict=True):
            env[f"INFERGATE_{name}"] = str(port)
        env["INFERGATE_MLFLOW__STORE_DIR"] = str(self.state_dir / "store")
        self.env = env
        self.port = int(env["INFERGATE_SERVE__PORT"])
        self.triton_metrics_url = f"http://{HOST}:{env['INFERGATE_TRITON__METRICS_PORT']}/metrics"
        up = self._cli("up", "--detach", timeout=START_TIMEOUT_S)
        if up.returncode != 0:
            raise StackError(f"infergate up failed:\n{up.stderr[-3000:]}")
        state = json.loads((self.state_dir / "stack.json").read_text())
        self.pid = int(state["pid"])
        served = self.state_dir / "triton-repository" / self.triton_model / "1" / "model.onnx"
        self.info["served_onnx"] = str(served)
        self.info["served_onnx_is_prepared_file"] = (
            served.exists() and sha256(served) == self.prepared.onnx_sha256
        )
        self.info["models"] = state.get("models")

    def triton_alone(self, texts: TextSets, profile: Profile) -> list[dict[str, Any]]:
        """Triton alone at concurrency 1: the platform's own gRPC client calling the served
        model straight, one pre-tokenized text at a time. With the floor's p50 it estimates
        the least end-to-end p50 of a Ray Serve front-end in front of this Triton."""
        spec = self.prepared.spec
        tokenizer = TextTokenizer.from_dir(self.prepared.tokenizer_dir, int(spec["max_length"]))
        backend = TritonBackend(f"{HOST}:{self.env['INFERGATE_TRITON__GRPC_PORT']}", 30.0)
        rows = []
        for tokens in profile.token_lengths:
            batches = [tokenizer([text]) for text in texts.by_tokens[tokens][:16]]
            requests = [(batch.input_ids, batch.attention_mask) for batch in batches]
            figures = run_sync(
                lambda requests=requests: sequential_calls(
                    backend, self.triton_model, spec["output_name"], requests,
                    profile.warmup_s, profile.duration_s,
                )
            )  # fmt: skip
            rows.append({"tokens": tokens, **figures})
        return rows

    def stop(self) -> None:
        if self.pid is None:
            return
        tree = procfs.snapshot([self.pid])
        down = self._cli("down", timeout=STOP_TIMEOUT_S)
        session, self.pid = self.pid, None
        # What `infergate down` left running is reported (a platform bug), then stopped.
        time.sleep(2)
        left = [info for info in tree.values() if info.still_running()]
        self.info["left_after_down"] = sorted(info.command for info in left)
        for info in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(info.pid, signal.SIGKILL)
        reap_session(session)
        if down.returncode != 0:
            raise StackError(f"infergate down failed:\n{down.stderr[-2000:]}")

    def roots(self) -> list[int]:
        return [self.pid] if self.pid else []

    def log_tail(self) -> str:
        log = self.state_dir / "logs" / "up.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else ""


class LeanStack(InfergateStack):
    """The same stack with a lean front-end of its own route (``infergate.bench.lean``)."""

    name = "lean"
    description = (
        "lean front-end on the infergate stack: parse, tokenize, one coalesced gRPC call to "
        "its Triton, softmax; no checks, metrics, drift or headers"
    )
    path = "/lean"

    def start(self) -> None:
        super().start()
        state = json.loads((self.state_dir / "stack.json").read_text())
        command = [
            sys.executable,
            "-m",
            "infergate.bench.lean",
            f"--ray-address={state['ray']}",
            f"--served-dir={self.prepared.served_dir}",
            f"--model={self.triton_model}",
            f"--route={self.path}",
        ]
        # A new local Ray cluster turns token authentication on unless RAY_AUTH_MODE says
        # otherwise (its token in ~/.ray/auth_token), and a client that names the cluster's
        # address must ask for it, before Ray is imported.
        env = {"RAY_AUTH_MODE": "token", **self.env}
        deploy = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S
        )
        if deploy.returncode != 0:
            raise StackError(f"deploying the lean front-end failed:\n{deploy.stderr[-3000:]}")
        target = self.target([self.body(["ready?"])])

        def answers() -> bool:  # HAProxy learns the new route a moment after the deploy
            return run_sync(lambda: send_once(target, target.bodies[0]))[0] == 200

        wait_until(None, answers, START_TIMEOUT_S, "the lean front-end")

    def triton_alone(self, texts: TextSets, profile: Profile) -> list[dict[str, Any]]:
        return []  # the same Triton as the infergate scenario's, which measures it


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
    """FastAPI + transformers + PyTorch fp32 under ``uvicorn --workers <cores>``."""

    name = "naive"
    description = "naive: FastAPI + transformers + PyTorch fp32, uvicorn, one worker per core"
    path = f"/v1/models/{MODEL_NAME}/predict"

    def start(self) -> None:
        [self.port] = free_ports(1)
        workers = os.cpu_count() or 1
        self.info.update(workers=workers, model_dir=str(self.prepared.hf_dir))
        command = [
            str(Path(sys.executable).with_name("uvicorn")),
            "infergate.bench.naive_server:app",
            f"--host={HOST}",
            f"--port={self.port}",
            f"--workers={workers}",
            "--no-access-log",
        ]
        env = {**os.environ, NAIVE_MODEL_ENV: str(self.prepared.hf_dir), "HF_HUB_OFFLINE": "1"}
        self.child = spawn(self.name, command, self.workdir / "logs", env)
        log_path = self.child.log_path

        def all_workers_up() -> bool:
            # One line per worker; /healthz alone could be answered by the first one up.
            return log_path.read_text().count("Application startup complete") >= workers

        wait_until(self.child, all_workers_up, START_TIMEOUT_S, "the naive server")


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


SCENARIOS: dict[str, type[Scenario]] = {
    cls.name: cls
    for cls in (InfergateStack, LeanStack, InprocessServe, FloorServe, EnsembleTriton, NaiveServer)
}
