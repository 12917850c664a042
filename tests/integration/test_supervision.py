"""The stack starts a component that exited again, and gives up on one that keeps exiting;
`down` and `up` take a supervisor that exited, and that no one has collected, for gone.

Killing the real Triton of a running stack is covered in tests/e2e/test_stack.py.
"""

import json
import subprocess
import sys
import time

import pytest

from infergate.config import load_config
from infergate.errors import StackError
from infergate.stack import supervisor as stack_module
from infergate.stack.processes import Child, alive, live_pids, spawn, stat_fields
from infergate.stack.state import read_state, stop_running
from infergate.stack.supervisor import RESTART_LIMIT, Stack


def exited_child(tmp_path) -> Child:
    child = spawn("prometheus", [sys.executable, "-c", "print('out of disk')"], tmp_path)
    child.popen.wait(timeout=30)
    return child


def test_a_component_that_exits_is_started_again_until_it_keeps_exiting(tmp_path, monkeypatch):
    supervisor = Stack(load_config(overrides={"state_dir": tmp_path}))
    started: list[Child] = []

    def start_prometheus() -> None:  # comes up, and will exit again
        started.append(exited_child(tmp_path))
        supervisor.children.append(started[-1])

    supervisor._start_prometheus = start_prometheus
    clock = [1000.0]
    monkeypatch.setattr(stack_module.time, "monotonic", lambda: clock[0])
    supervisor.children = [exited_child(tmp_path)]
    for _ in range(RESTART_LIMIT):
        supervisor._start_again(supervisor.children[0])
        clock[0] += 60
    assert len(started) == RESTART_LIMIT and supervisor.children == [started[-1]]
    with pytest.raises(StackError, match=r"(?s)out of disk.*giving up"):
        supervisor._start_again(supervisor.children[0])
    # Restarts long ago do not count.
    clock[0] += stack_module.RESTART_WINDOW_S
    supervisor._start_again(supervisor.children[0])
    assert len(started) == RESTART_LIMIT + 1


def test_what_is_left_of_an_exited_childs_group_is_stopped(tmp_path):
    # A parent that exits at once, leaving its child (a Triton stub, say) in its group.
    code = "import subprocess; subprocess.Popen(['sleep', '60'])"
    child = spawn("triton", [sys.executable, "-c", code], tmp_path)
    child.popen.wait(timeout=30)
    assert running_in_group(child.popen.pid), "the grandchild runs before stop()"
    child.stop()
    deadline = time.monotonic() + 10
    while running_in_group(child.popen.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running_in_group(child.popen.pid) == []


def running_in_group(group: int) -> list[int]:
    """Processes of ``group`` that run (a killed one is a zombie until it is reaped)."""
    found = []
    for pid in live_pids():
        fields = stat_fields(pid)
        if fields and fields[0] != "Z" and int(fields[2]) == group:
            found.append(pid)
    return found


def test_a_supervisor_that_exited_uncollected_is_gone(tmp_path):
    # A detached supervisor's parent is init, which may collect it seconds after it exits;
    # meanwhile it is a zombie, which still takes signals (os.kill(pid, 0) succeeds).
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while alive(exited.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stat_fields(exited.pid)[0] == "Z", "not a zombie: the test shows nothing"
    state = tmp_path / "stack.json"
    state.write_text(json.dumps({"pid": exited.pid}))
    assert read_state(tmp_path) is None and not state.exists()
    state.write_text(json.dumps({"pid": exited.pid}))
    assert stop_running(tmp_path) is False
    exited.wait()
