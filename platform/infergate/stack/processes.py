"""Child processes of the local stack: start, wait until ready, stop without orphans."""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from infergate.errors import StackError

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM if the supervisor dies, so nothing is orphaned."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def terminate(self) -> None:
        """SIGTERM the child's whole process group, without waiting (see ``stop``)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the child's whole process group, SIGKILL what is left after the timeout."""
        if self.popen.poll() is not None:
            # Its group may outlive it (Triton's model stubs): nothing of it may stay.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            return
        self.terminate()
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=5)


def spawn(
    name: str, command: Sequence[str], log_dir: Path, env: Mapping[str, str] | None = None
) -> Child:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with log_path.open("ab") as log_file:
        popen = subprocess.Popen(
            list(command),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            start_new_session=True,  # its own process group, so stop() reaches its workers
            preexec_fn=_die_with_parent,
        )
    return Child(name, popen, log_path)


def wait_until(child: Child | None, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``ready`` until true; fail early and clearly if the child dies first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child is not None and not child.alive():
            raise StackError(
                f"{what} exited with code {child.popen.returncode} while starting; "
                f"last lines of {child.log_path}:\n{child.log_tail()}"
            )
        with contextlib.suppress(Exception):
            if ready():
                return
        time.sleep(0.25)
    raise StackError(f"{what} was not ready after {timeout_s:.0f} s; see its log")


# Ports for servers that bind them seconds later (the benchmark's scenarios, the tests'
# stacks). Not from the kernel's ephemeral range, where any outgoing connection meanwhile
# may take the port (Ray opens hundreds while it starts; HAProxy once found its port
# taken that way), nor from Ray's own: worker ports 10002-19999 and Serve's
# direct-ingress replica ports from 30000.
LATE_BIND_PORTS = range(20000, 30000)


def ephemeral_ports() -> range:
    """The ports the kernel hands to outgoing connections (Linux)."""
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return range(low, high + 1)


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback TCP ports from ``LATE_BIND_PORTS`` that were free a
    moment ago and lie outside this machine's ephemeral range."""
    ephemeral = ephemeral_ports()
    candidates = [port for port in LATE_BIND_PORTS if port not in ephemeral]
    if len(candidates) < count:
        raise StackError(
            f"the ephemeral port range {ephemeral.start}-{ephemeral.stop - 1} covers the "
            f"ports kept for servers ({LATE_BIND_PORTS.start}-{LATE_BIND_PORTS.stop - 1})"
        )
    chosen: list[int] = []
    for port in random.sample(candidates, len(candidates)):
        if port_free("127.0.0.1", port):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise StackError(f"fewer than {count} free ports in {LATE_BIND_PORTS}")


def listening_ports() -> set[int]:
    """The TCP ports something on this host (this network namespace) listens on."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def free_port_block(start: int, stop: int, size: int) -> range:
    """One of the blocks of ``size`` ports in ``[start, stop)`` (in steps of ``size``)
    where nothing listens yet, at random: two stacks started at once, before either
    listens, seldom take the same. ``StackError`` if there is none."""
    busy = listening_ports()
    blocks = [range(first, first + size) for first in range(start, stop - size + 1, size)]
    free = [block for block in blocks if not busy.intersection(block)]
    if free:
        return random.choice(free)
    raise StackError(f"no {size} free ports in a row in {start}-{stop - 1}")


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a GET of ``url`` answers 200 (for ``wait_until``, which absorbs errors)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return bool(response.status == 200)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(ports: Mapping[str, tuple[str, int, str]]) -> None:
    """``ports`` maps a description to (host, port, env var that moves it)."""
    busy = [
        f"port {port} ({what}) is already in use on {host}; stop what uses it "
        f"or choose another with {env}=PORT"
        for what, (host, port, env) in ports.items()
        if not port_free(host, port)
    ]
    if busy:
        raise StackError("\n".join(busy))


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (0-based: state 0, parent
    1, process group 2, session 3, utime 11, stime 12, start time 19, RSS pages 21); None
    when the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields if len(fields) > 21 else None  # read while the process was being reaped


def live_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def descendants(pids: Iterable[int]) -> list[int]:
    """Every live process below ``pids`` in the process tree (Linux /proc), sorted."""
    children: dict[int, list[int]] = {}
    for pid in live_pids():
        fields = stat_fields(pid)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(pid)
    found: set[int] = set()
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found)


def reap(pids: list[int], timeout_s: float = 10.0, exclude: set[int] | None = None) -> None:
    """SIGTERM ``pids``, then SIGKILL whatever is still there after ``timeout_s``.

    ``exclude`` spares those processes and everything below them."""
    if exclude:
        spared = set(exclude).union(descendants(exclude))
        pids = [pid for pid in pids if pid not in spared]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(alive(pid) for pid in pids):
            time.sleep(0.1)


def alive(pid: int) -> bool:
    """Running, not a zombie (a zombie is dead, only not yet collected)."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"
