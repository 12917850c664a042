"""Ray's start is tried again when Ray misses its own start-up deadline."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import ray
from ray import serve

from infergate.config import ServeSettings
from infergate.stack import ray_start


@pytest.fixture
def ray_calls(monkeypatch):
    """ray.init fails with Ray's timeout message as often as ``calls["fail"]`` says."""
    calls = {"fail": 0, "init": 0, "shutdown": 0, "reaped": 0, "serve": 0}

    def init(**kwargs) -> None:
        calls["init"] += 1
        if calls["init"] <= calls["fail"]:
            raise Exception("The current node timed out during startup.")

    def count(name):
        def call(*args, **kwargs) -> None:
            calls[name] += 1

        return call

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", count("shutdown"))
    monkeypatch.setattr(serve, "start", count("serve"))
    monkeypatch.setattr(ray_start, "reap", count("reaped"))
    # What the start exports stays in this test's copy of the environment.
    environ = {k: v for k, v in os.environ.items() if k not in ray_start.WORKER_ENV}
    monkeypatch.setattr(os, "environ", environ)
    return calls


def test_an_attempt_that_times_out_is_cleaned_up_and_tried_again(ray_calls):
    ray_calls["fail"] = ray_start.RAY_START_ATTEMPTS - 1
    ray_start.start_ray(ServeSettings(fast_ingress=False), keep=set())
    assert ray_calls["init"] == ray_start.RAY_START_ATTEMPTS
    assert ray_calls["shutdown"] == ray_calls["reaped"] == ray_start.RAY_START_ATTEMPTS - 1
    assert ray_calls["serve"] == 1


def test_the_last_timeout_is_raised(ray_calls):
    ray_calls["fail"] = ray_start.RAY_START_ATTEMPTS
    with pytest.raises(Exception, match="timed out during startup"):
        ray_start.start_ray(ServeSettings(fast_ingress=False), keep=set())
    assert ray_calls["init"] == ray_start.RAY_START_ATTEMPTS
    assert ray_calls["serve"] == 0


START_BESIDE_A_LEFT_CLUSTER = """
import ray
from infergate.config import ServeSettings
from infergate.stack.processes import free_ports
from infergate.stack.ray_start import start_ray

start_ray(ServeSettings(fast_ingress=False, port=free_ports(1)[0]), keep=set())
print(ray.get_runtime_context().gcs_address)
ray.shutdown()
"""


def test_the_stack_starts_a_ray_of_its_own_beside_one_that_ray_start_left_behind():
    """`ray start` records its cluster in <temp>/ray/ray_current_cluster, and a plain
    ray.init() joins that one (or fails, if it is gone): a stack must start its own."""
    temp = Path(tempfile.mkdtemp(prefix="rt-"))  # short: Ray's socket paths have a limit
    try:
        (temp / "ray").mkdir()
        (temp / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")  # nobody there
        run = subprocess.run(
            [sys.executable, "-c", START_BESIDE_A_LEFT_CLUSTER],
            env={**os.environ, "RAY_TMPDIR": str(temp)},
            capture_output=True, text=True, timeout=120,  # joining the left one hangs
            start_new_session=True,  # what Ray kills when it fails is not ours
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        # The address of the cluster it joined: one it started, not the one left behind
        # (a substring test would also refuse a port such as 12345).
        joined = run.stdout.strip().splitlines()[-1]
        assert re.fullmatch(r"[\d.]+:\d+", joined) and joined != "127.0.0.1:1", run.stdout
    finally:
        shutil.rmtree(temp, ignore_errors=True)
