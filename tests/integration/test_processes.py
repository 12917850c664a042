"""Child processes: port checks, and reaping a whole process tree."""

import socket
import subprocess
import time

import pytest

from infergate.errors import StackError
from infergate.stack import processes
from infergate.stack.processes import (
    LATE_BIND_PORTS,
    check_ports,
    descendants,
    ephemeral_ports,
    free_ports,
    port_free,
    reap,
)


def test_busy_ports_are_named_with_the_variable_that_moves_them():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not port_free("127.0.0.1", port)
        with pytest.raises(StackError, match=f"port {port} \\(Triton\\).*INFERGATE_X=PORT"):
            check_ports({"Triton": ("127.0.0.1", port, "INFERGATE_X")})
    assert port_free("127.0.0.1", port)


def test_ports_for_late_binding_are_free_distinct_and_not_ephemeral():
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(port in LATE_BIND_PORTS and port not in ephemeral_ports() for port in ports)
    assert all(port_free("127.0.0.1", port) for port in ports)


def test_ports_in_use_are_skipped(monkeypatch):
    [port] = free_ports(1)
    monkeypatch.setattr(processes, "LATE_BIND_PORTS", range(port, port + 1))
    assert free_ports(1) == [port]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        with pytest.raises(StackError, match="fewer than 1 free ports"):
            free_ports(1)


def test_reap_ends_a_tree_and_spares_what_is_excluded():
    tree = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"])
    spared = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.3)
        below = descendants([tree.pid])
        assert len(below) == 2
        reap([tree.pid, *below, spared.pid], timeout_s=5, exclude={spared.pid})
        assert tree.wait(timeout=5) is not None
        assert not descendants([tree.pid])
        assert spared.poll() is None
    finally:
        spared.kill()
        spared.wait()
