"""The scenarios on the stack of ``infergate up``, started on free loopback ports: the
platform end to end, and a lean front-end deployed as a route of its own on that same stack.
Their Triton is also measured alone, called straight with the platform's gRPC client.
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
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from infergate.bench import procfs
from infergate.bench.loadgen import percentile, run_sync, send_once
from infergate.bench.prepare import MODEL_NAME, PreparedModel, prepare_stand_in, sha256
from infergate.bench.scenarios import HOST, START_TIMEOUT_S, Scenario, reap_session
from infergate.bench.workload import Profile, TextSets
from infergate.errors import StackError
from infergate.serving.tokenization import TextTokenizer
from infergate.stack.processes import free_ports, wait_until
from infergate.triton.client import TritonBackend
from infergate.versions import triton_model_name

INFERGATE = str(Path(sys.executable).with_name("infergate"))
STOP_TIMEOUT_S = 120.0
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
    "SERVE__FALLBACK_PROXY_PORT",
    "SERVE__FALLBACK_PROXY_GRPC_PORT",
    "FRONTEND__GRPC_PORT",
    "PROMETHEUS__PORT",
    "ADMIN__PORT",
)


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
                partial(sequential_calls, backend, self.triton_model, spec["output_name"],
                        requests, profile.warmup_s, profile.duration_s)
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


class StandInStack(InfergateStack):
    """The same stack serving a model that costs Triton next to nothing (the stand-in,
    ``prepare.prepare_stand_in``, registered once): the front-end as it runs before a GPU,
    whose model takes microseconds. On these CPU cores the real model holds the replicas
    to a few hundred requests a second, where they idle between bursts; here they are what
    limits the rate, and their CPU per request is what a GPU's front-end would spend."""

    name = "stand-in"
    description = (
        "infergate end to end before a stand-in model that costs Triton next to nothing: "
        "the front-end as it runs before a GPU"
    )

    def start(self) -> None:
        say = partial(print, f"[{self.name}]", file=sys.stderr, flush=True)
        self.prepared = prepare_stand_in(self.prepared, say)
        self.triton_model = triton_model_name(MODEL_NAME, self.prepared.version)
        super().start()

    def triton_alone(self, texts: TextSets, profile: Profile) -> list[dict[str, Any]]:
        return []  # the real model's Triton is the infergate scenario's to measure


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
