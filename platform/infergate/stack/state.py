"""What a running stack wrote about itself (``stack.json`` in its state folder), and how
`infergate down` asks it to stop: the commands that only look at a stack or stop it need
none of what starting one takes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from infergate.errors import StackError
from infergate.files import write_atomically
from infergate.stack.processes import alive

STATE_FILE = "stack.json"


def write_state(state_dir: Path, state: dict[str, Any]) -> None:
    """Write ``stack.json`` in one step: `up --detach` polls it while it is written, and
    takes a file it cannot parse for a stale one."""
    write_atomically(state_dir / STATE_FILE, json.dumps(state, indent=2))


def read_state(state_dir: Path) -> dict[str, Any] | None:
    """What the running stack wrote about itself; None (and a stale file removed) if none runs."""
    path = state_dir / STATE_FILE
    try:
        state = json.loads(path.read_text())
        running = alive(int(state["pid"]))  # not a zombie no one has collected yet
    except FileNotFoundError:
        return None
    except (ValueError, KeyError):
        running = False
    if not running:
        path.unlink(missing_ok=True)
        return None
    return state


def stop_running(state_dir: Path, timeout_s: float = 60.0) -> bool:
    """Ask the supervisor recorded in the state folder to stop; False if none runs."""
    state = read_state(state_dir)
    if state is None:
        return False
    pid = int(state["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # Exited is enough: a detached supervisor's parent is init, which may collect it
        # seconds later (a zombie still takes signals).
        if not alive(pid):
            return True
        time.sleep(0.1)
    raise StackError(f"the stack (pid {pid}) did not stop within {timeout_s:.0f} s")
