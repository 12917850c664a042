"""`infergate triton` on a second "host" (a network namespace, ``network_hosts``), as an
operator would start it there: an empty repository of its own, and no sight of the
control plane's disk (its own mount namespace, where an empty filesystem lies over the
folder ``hidden``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import tritonclient.http as triton_http
from conftest import wait_for

from network_hosts import Host, network_host
from triton_process import stop_process

INFERGATE = str(Path(sys.executable).with_name("infergate"))


@dataclass
class TritonHost:
    """`infergate triton` inside a network host; ``start`` again after a kill."""

    host: Host
    env: dict[str, str]
    state_dir: Path
    hidden: Path  # the control plane's state folder, out of this host's sight
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def http_url(self) -> str:
        return f"{self.host.address}:{self.env['INFERGATE_TRITON__HTTP_PORT']}"

    @property
    def repository(self) -> Path:
        return self.state_dir / "triton-repository"

    def start(self) -> None:
        self.starts += 1
        # `ip netns exec` gives the command a mount namespace of its own: a mount made
        # there stays there.
        hide = 'mount -t tmpfs -o size=1m,mode=0555 hidden "$0" && exec "$@"'
        command = self.host.command(
            "sh", "-c", hide, str(self.hidden),
            INFERGATE, "triton", "--address", "0.0.0.0", "--state-dir", str(self.state_dir),
        )  # fmt: skip
        with (self.state_dir / f"triton-{self.starts}.log").open("wb") as log:
            self.process = subprocess.Popen(
                command, env=self.env, stdout=log, stderr=log, start_new_session=True
            )
        client = triton_http.InferenceServerClient(self.http_url)
        wait_for(lambda: _answers(client), 60, "Triton in the network host answering")

    def kill(self) -> None:
        """Triton and its model stubs at once, as when its machine or container dies (the
        stubs of a tritonserver killed alone were once left running for good)."""
        assert self.process is not None
        self.kill_group()
        self.process.wait(timeout=30)

    def kill_group(self) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):  # ip netns exec execs: Triton's group
            os.killpg(self.process.pid, signal.SIGKILL)


def _answers(client: triton_http.InferenceServerClient) -> bool:
    try:
        return client.is_server_ready()
    except Exception:  # not listening yet
        return False


@contextmanager
def running_triton_host(
    name: str, env: dict[str, str], state_dir: Path, hidden: Path
) -> Iterator[TritonHost]:
    """`infergate triton` answering in a new network host ``name`` (on ``env``'s ports),
    stopped at the end."""
    with network_host(name) as host:
        triton = TritonHost(host, env, state_dir, hidden=hidden)
        try:
            triton.start()
            yield triton
        finally:
            if triton.process is not None:
                stop_process(triton.process)
                triton.kill_group()  # what a stop that timed out left
