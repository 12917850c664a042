"""A real tritonserver for tests (the nvidia-pytriton wheel's), on free ports."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from infergate.config import TritonSettings
from infergate.stack.processes import free_ports
from infergate.triton.client import TritonControl
from infergate.triton.server import prepare_backends, server_command, server_environment

__all__ = ["RunningTriton", "start_triton", "stop_process"]


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Terminate, wait, then kill if it is still there."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout_s)


@dataclass
class RunningTriton:
    """A tritonserver started by :func:`start_triton`."""

    settings: TritonSettings
    repository: Path
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.metrics_port}/metrics"

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def start_triton(workdir: Path, settings: TritonSettings | None = None) -> RunningTriton:
    """Start tritonserver on free ports with an empty repository under ``workdir`` and wait
    until it is ready. Stop it with :func:`stop_process` on ``.process``."""
    http_port, grpc_port, metrics_port = free_ports(3)
    settings = (settings or TritonSettings()).model_copy(
        update={"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
    )
    repository = workdir / "repository"
    repository.mkdir(parents=True, exist_ok=True)
    command = server_command(settings, repository, prepare_backends(workdir))
    log_path = workdir / "tritonserver.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            env=server_environment(os.environ),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    triton = RunningTriton(settings, repository, process, log_path)
    control = TritonControl(settings.grpc_url)
    deadline = time.monotonic() + settings.startup_timeout_s
    try:
        while not control.server_ready():
            if process.poll() is not None or time.monotonic() > deadline:
                stop_process(process)
                pytest.fail(f"tritonserver did not start:\n{triton.log_tail()}")
            time.sleep(0.1)
    finally:
        control.close()
    return triton


@contextmanager
def running_triton(
    workdir: Path, settings: TritonSettings | None = None
) -> Iterator[RunningTriton]:
    """:func:`start_triton`, stopped when the block ends."""
    triton = start_triton(workdir, settings)
    try:
        yield triton
    finally:
        stop_process(triton.process)
