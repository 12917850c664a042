"""Fixtures that start real processes for the end-to-end tests, as a user would."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

# MLflow's telemetry client starts in a thread of the first MLflow call and writes
# os.environ (_MLFLOW_TELEMETRY_SESSION_ID) while other threads read it: a test's MLflow
# request once failed with KeyError '_MLFLOW_TELEMETRY_SESSION_ID' from urllib's scan of
# the environment for proxies. There is no internet here to send telemetry to anyway.
# Set before MLflow is imported; the stacks' processes inherit it.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from infergate.cli import build_parser
from infergate.errors import exit_code
from infergate.registry import Registry
from infergate.stack.processes import free_ports
from infergate.versions import SPEC_FILE
from shared_stack import (  # noqa: F401  # the hooks that stop the shared stack early
    pytest_collection_modifyitems,
    pytest_runtest_teardown,
    stopping,
)
from triton_process import RunningTriton, running_triton


@pytest.fixture(scope="module")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTriton]:
    """A real tritonserver for the tests of one module."""
    with running_triton(tmp_path_factory.mktemp("triton")) as triton:
        yield triton


# -- the whole stack, once per test session ---------------------------------------------

RECONCILE_INTERVAL_S = 30
REDACT_MODEL = "ner"  # the demo's PII model


@dataclass(frozen=True)
class Stack:
    url: str
    mlflow: str
    admin: str
    env: dict[str, str]
    state_dir: Path
    # A command the CLI runs under, e.g. one that gives it a mount namespace of its own.
    prefix: tuple[str, ...] = ()

    infergate: str = str(Path(sys.executable).with_name("infergate"))

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, self.infergate, *args, "--state-dir", str(self.state_dir)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def register(
        self, folder: Path, name: str, task: str, *options: str
    ) -> subprocess.CompletedProcess[str]:
        """`infergate register` a model folder into this stack's MLflow (``options`` such
        as ``"--alias", "champion"``): the command line's own parser and command, run in
        this process, its exit code and what it printed returned as a process's.

        This process has imported PyTorch, transformers, ONNX Runtime and MLflow already,
        and they are most of a command's time: a tiny model took 1.3-2.4 s here against
        8-9 s for `infergate register` in a process of its own. The tests of the command
        itself (test_stack.py) run it as a process."""
        argv = ["register", str(folder), "--name", name, "--task", task, *options, "--quiet",
                "--tracking-uri", self.mlflow, "--state-dir", str(self.state_dir)]  # fmt: skip
        args = build_parser().parse_args(argv)
        printed, errors = io.StringIO(), io.StringIO()
        with redirect_stdout(printed), redirect_stderr(errors):
            code = exit_code(lambda: args.func(args))
        registered = subprocess.CompletedProcess(argv, code, printed.getvalue(), errors.getvalue())
        assert code == 0, registered.stderr[-2000:]
        return registered


def stack_env(state_dir: Path) -> dict[str, str]:
    names = ["MLFLOW__PORT", "TRITON__HTTP_PORT", "TRITON__GRPC_PORT", "TRITON__METRICS_PORT",
             "SERVE__PORT", "SERVE__METRICS_EXPORT_PORT", "SERVE__HAPROXY_STATS_PORT",
             "SERVE__HAPROXY_METRICS_PORT", "SERVE__FALLBACK_PROXY_PORT",
             "SERVE__FALLBACK_PROXY_GRPC_PORT", "FRONTEND__GRPC_PORT", "PROMETHEUS__PORT",
             "ADMIN__PORT"]  # fmt: skip
    ports = free_ports(len(names))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.update({f"INFERGATE_{name}": str(port) for name, port in zip(names, ports, strict=True)})
    env["INFERGATE_MLFLOW__STORE_DIR"] = str(state_dir / "store")
    # Long enough that a reconcile rarely falls inside the webhook test's wait (that test
    # also finds the delivery in the control plane's log).
    env["INFERGATE_RECONCILE_INTERVAL_S"] = str(RECONCILE_INTERVAL_S)
    # The payload log, to STATE_DIR/payloads: every answer a canary gives, to a client or
    # in shadow, so a test can tell which of them reached a client (a champion's only a
    # little: load tests measure the replicas).
    payloads = {"ENABLED": "true", "SAMPLE__CANARY": "1", "SAMPLE__SHADOW": "1",
                "FLUSH_INTERVAL_S": "1"}  # fmt: skip
    env.update({f"INFERGATE_FRONTEND__PAYLOADS__{k}": v for k, v in payloads.items()})
    return env


@contextmanager
def running_stack(
    state_dir: Path,
    env: dict[str, str],
    *up: str,
    timeout_s: float = 600,
    prefix: tuple[str, ...] = (),
) -> Iterator[Stack]:
    """`infergate up --detach` (with the ``up`` flags) on ``env``'s ports, every CLI call
    run under ``prefix``; down at the end."""
    running = Stack(
        url=f"http://127.0.0.1:{env['INFERGATE_SERVE__PORT']}",
        mlflow=f"http://127.0.0.1:{env['INFERGATE_MLFLOW__PORT']}",
        admin=f"http://127.0.0.1:{env['INFERGATE_ADMIN__PORT']}",
        env=env,
        state_dir=state_dir,
        prefix=prefix,
    )
    started = running.cli("up", *up, "--detach", timeout=timeout_s)
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        yield running
    finally:
        down = running.cli("down", timeout=120)
        assert down.returncode == 0, down.stderr


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[Stack]:
    state_dir = tmp_path_factory.mktemp("stack")
    env = stack_env(state_dir)
    # The payload log's texts redacted by the demo's PII model (test_stack.py checks it).
    env.update({"INFERGATE_FRONTEND__PAYLOADS__TEXTS": "redact",
                "INFERGATE_FRONTEND__PAYLOADS__REDACT_MODEL": REDACT_MODEL})  # fmt: skip
    with stopping(pytestconfig) as stops:  # after the last test on it (shared_stack.py)
        yield stops.enter_context(running_stack(state_dir, env, "--demo", timeout_s=1800))


@pytest.fixture(scope="session")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        yield client


def run_batch(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`infergate batch ARGS` on the stack's registry, on a Ray of its own on this machine
    (the stack's Ray asks drivers that join it for an authentication token)."""
    environment = {k: v for k, v in stack.env.items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        [stack.infergate, "batch", *args, "--tracking-uri", stack.mlflow,
         "--state-dir", str(stack.state_dir)],
        env=environment, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def predict(http: httpx.Client, model: str, inputs, **kw) -> httpx.Response:
    return http.post(f"/v1/models/{model}/predict", json={"inputs": inputs, **kw})


def wait_for(condition, timeout_s: float, what: str, interval_s: float = 0.25):
    """Poll until ``condition()`` is truthy; return its value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")


def clone_version(
    registry: Registry,
    name: str,
    version: str,
    tmp_path: Path,
    *,
    corrupt: bool = False,
    broken_tokenizer: bool = False,
    swap_labels: bool = False,
    max_length: int | None = None,
    slow: bool = False,
) -> str:
    """A new version of ``name`` made of ``version``'s files; optionally a broken ONNX
    (Triton cannot load it) or tokenizer (the front-end replicas cannot), or its labels
    in reverse order (it loads and answers fine, every answer of two classes flipped), or
    a ``max_length`` its graph cannot take (it fails on texts longer than its positions),
    or ``slow``: several times slower with the same answers (``tiny_models.slowed``)."""
    import mlflow

    source = registry.version_source(name, version)
    files = Path(
        mlflow.artifacts.download_artifacts(
            source, dst_path=str(tmp_path), tracking_uri=registry.tracking_uri
        )
    )
    if corrupt:
        (files / "model.onnx").write_bytes(b"this is not an ONNX graph")
    if broken_tokenizer:
        (files / "tokenizer" / "tokenizer.json").write_text("this is not a tokenizer")
    if slow:
        from tiny_models import slowed

        slowed(files / "model.onnx", json.loads((files / SPEC_FILE).read_text())["output_name"])
    if swap_labels or max_length:
        spec = json.loads((files / SPEC_FILE).read_text())
        if swap_labels:
            spec["labels"] = spec["labels"][::-1]
        if max_length:
            spec["max_length"] = max_length
        (files / SPEC_FILE).write_text(json.dumps(spec))
    task = registry.model(name).task
    return registry.register(name, task, files, metrics={}, params={}, tags={"test": "yes"})


@dataclass
class Load:
    """A steady client in a thread: ``send()`` every ``interval_s``, each answer recorded
    as (sent at, seconds, status or 0 for no HTTP answer, JSON body or not)."""

    send: Callable[[], httpx.Response]
    interval_s: float = 0.02
    answers: list[tuple[float, float, int, bool]] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)  # the first of each kind, for reports
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                response = self.send()
                status = response.status_code
                is_json = response.headers.get("content-type") == "application/json"
            except httpx.HTTPError as error:
                status, is_json = 0, False  # refused, reset or timed out
                self.failures.setdefault(type(error).__name__, str(error)[:200])
            self.answers.append((sent, time.monotonic() - sent, status, is_json))
            time.sleep(self.interval_s)

    def __enter__(self) -> Load:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


# -- the README's curl examples ------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
TASKS_SECTION = "### Other tasks"  # its examples name the models test_other_tasks.py registers


def readme_curl_commands(section: str | None = None, skip_section: str | None = None) -> list[str]:
    """The curl commands of the README's bash blocks: all of them, those under the heading
    starting ``section`` only, or all but those under ``skip_section``."""
    text = (ROOT / "README.md").read_text()
    parts = re.split(r"\n(?=#{2,3} )", text)
    if section is not None:
        parts = [part for part in parts if part.startswith(section)]
    if skip_section is not None:
        parts = [part for part in parts if not part.startswith(skip_section)]
    commands = []
    for part in parts:
        for block in re.findall(r"```bash\n(.*?)```", part, flags=re.S):
            for command in re.split(r"\n(?=\S)", block.replace("\\\n", " ")):
                if command.strip().startswith("curl"):
                    commands.append(command.strip())
    return commands
