"""Second "hosts" on this machine for multi-machine tests: network namespaces, each with
its own address on a veth pair to this one. Traffic stays on the pair.

Needs root (``ip netns``); tests that use it skip with the reason where it is missing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

SUBNETS = 250  # 10.231.0.0/30 to 10.231.249.0/30


@dataclass(frozen=True)
class Host:
    """A network namespace reachable at ``address`` from this machine (``gateway``)."""

    name: str
    address: str
    gateway: str

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the host."""
        return ["ip", "netns", "exec", self.name, *argv]


def unavailable() -> str | None:
    """Why no host can be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no 'ip' command (Debian package iproute2)"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _claim_subnet(held: ExitStack) -> int:
    """A subnet no other test process holds (a lock file each, kept while ``held`` is open)
    and no interface of this machine uses (one a killed run left behind)."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    folder = Path(tempfile.gettempdir()) / "infergate-test-subnets"
    folder.mkdir(exist_ok=True)
    for subnet in range(SUBNETS):
        if f" 10.231.{subnet}.1/" in used:
            continue
        lock = (folder / f"{subnet}.lock").open("a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another worker's
            lock.close()
            continue
        held.enter_context(lock)
        return subnet
    raise RuntimeError(f"all {SUBNETS} test subnets of 10.231.0.0/16 are taken")


@contextmanager
def network_host(name: str) -> Iterator[Host]:
    """A namespace ``name`` at 10.231.<subnet>.2, this machine at 10.231.<subnet>.1, on a
    subnet no other test process (another worker's) is using."""
    with ExitStack() as held, _created(name, _claim_subnet(held)) as host:
        yield host


@contextmanager
def _created(name: str, subnet: int) -> Iterator[Host]:
    gateway, address = f"10.231.{subnet}.1", f"10.231.{subnet}.2"
    outside, inside = f"{name}-o", f"{name}-i"
    _ip("netns", "add", name)
    try:
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", name)
        _ip("addr", "add", f"{gateway}/30", "dev", outside)
        _ip("link", "set", outside, "up")
        for args in (("addr", "add", f"{address}/30", "dev", inside),
                     ("link", "set", inside, "up"), ("link", "set", "lo", "up")):  # fmt: skip
            _ip("netns", "exec", name, "ip", *args)
        yield Host(name, address, gateway)
    finally:
        subprocess.run(["ip", "link", "del", outside], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
