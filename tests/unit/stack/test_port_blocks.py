"""Each stack's block of ports for its replicas' own gRPC servers."""

from __future__ import annotations

import socket

import pytest

from infergate.errors import StackError
from infergate.stack.processes import free_port_block, listening_ports


def test_a_block_where_something_listens_is_passed_over() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert port in listening_ports()
        starts = {free_port_block(port - 5, port + 25, 10).start for _ in range(50)}
        assert starts and starts <= {port + 5, port + 15}  # a free block, never the busy one
        with pytest.raises(StackError, match="no 10 free ports"):
            free_port_block(port - 5, port + 5, 10)
    assert port not in listening_ports()
