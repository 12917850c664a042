"""Ray's start is tried again when Ray misses its own start-up deadline."""

import os

import pytest
import ray
from ray import serve

from infergate import ray_start
from infergate.config import ServeSettings


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
