"""``stack.json``: what a running stack wrote about itself, which `up --detach` polls
while the stack writes it."""

import os
import threading

from infergate.stack.state import STATE_FILE, read_state, write_state


def test_a_state_file_read_while_it_is_written_is_never_taken_for_a_stale_one(tmp_path):
    # A reader that found half a file took it for a stale one and removed it: `up --detach`
    # then waited for a file that was gone until its timeout, beside a stack that was up.
    state = {"pid": os.getpid(), "models": [f"model-{i} v1" for i in range(100)]}
    write_state(tmp_path, state)
    stop = threading.Event()

    def write_again_and_again() -> None:
        while not stop.is_set():
            write_state(tmp_path, state)

    writer = threading.Thread(target=write_again_and_again)
    writer.start()
    try:
        read = [read_state(tmp_path) for _ in range(1000)]
    finally:
        stop.set()
        writer.join()
    assert sum(r != state for r in read) == 0
    assert (tmp_path / STATE_FILE).exists()


def test_a_state_file_of_a_stack_that_is_gone_is_removed(tmp_path):
    write_state(tmp_path, {"pid": 2**22 + 1})  # above Linux's largest pid
    assert read_state(tmp_path) is None
    assert not (tmp_path / STATE_FILE).exists()
