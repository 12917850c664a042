"""A child forked by an infergate process after gRPC started runs no gRPC threads.

gRPC's fork handlers start its threads again in a forked child, and there they sometimes
aborted the child before its exec: Ray's GCS or raylet then never ran (see
infergate/__init__.py). Checked in a fresh interpreter, as a user's process starts.
"""

import os
import subprocess
import sys

CHILD_THREADS = """
import os, sys, time
{prelude}
import tritonclient.grpc as grpcclient

client = grpcclient.InferenceServerClient("127.0.0.1:1")  # nothing listens: gRPC starts anyway
try:
    client.is_server_ready(client_timeout=0.2)
except Exception:
    pass
pid = os.fork()
if pid == 0:
    time.sleep(0.3)  # what gRPC would start in the child is running by now
    os._exit(len(os.listdir("/proc/self/task")))
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def threads_in_forked_child(prelude: str) -> int:
    code = CHILD_THREADS.format(prelude=prelude)
    # Without what this test process exported on importing infergate.
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert run.returncode == 0, run.stderr
    return int(run.stdout.strip().splitlines()[-1])


def test_a_child_forked_by_an_infergate_process_runs_one_thread():
    assert threads_in_forked_child("import infergate") == 1


def test_without_it_grpc_starts_threads_in_the_child():
    # The check above can fail: gRPC's default does start threads in the child.
    assert threads_in_forked_child("") > 1
