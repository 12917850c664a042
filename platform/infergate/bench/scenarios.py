"""What every scenario is: the ``Scenario`` the runner starts, measures and stops, and what
the scenarios share (the loopback host, the start timeout, infergate's request and answer,
reaping what a scenario left running).

Every scenario serves the prepared ``sentiment`` model (``infergate.bench.prepare``) and is
one process tree the harness started, so its memory and CPU can be read from ``/proc``.
The scenarios themselves: ``infergate.bench.stack_scenarios`` (on the stack of
``infergate up``) and ``infergate.bench.baselines`` (each a process of its own). The
ceiling is not one: it has no server (``infergate.bench.ceiling``).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from infergate.bench import procfs
from infergate.bench.loadgen import HttpTarget
from infergate.bench.prepare import PreparedModel
from infergate.bench.workload import Profile, TextSets
from infergate.stack.processes import reap

HOST = "127.0.0.1"
START_TIMEOUT_S = 600.0  # the whole stack: MLflow, Triton, Ray Serve, Prometheus


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
