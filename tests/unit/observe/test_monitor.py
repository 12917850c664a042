"""Per-version statistics of a replica, with a fake clock and a recording telemetry."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from fakes import FakeClock, Recorder, answered
from infergate.observe.backlog import MAX_REQUESTS
from infergate.observe.monitor import Monitors
from infergate.observe.reference import reference_stats
from infergate.serving.runtime import Prediction
from infergate.versions import ServedVersion

LABELS = ["negative", "positive"]


def runtime(reference: dict) -> SimpleNamespace:
    served = ServedVersion("m", "1", "text-classification", "src")
    spec = SimpleNamespace(labels=LABELS, task="text-classification")
    return SimpleNamespace(served=served, spec=spec, reference=reference)


def prediction(n: int, positive: float) -> Prediction:
    return answered(np.tile([1 - positive, positive], (n, 1)), LABELS, tokens=10)


def test_counts_errors_latency_and_classes_per_version():
    reference = reference_stats("text-classification", np.full(100, 10), np.zeros(100),
                                np.tile([0.2, 0.8], (100, 1)), LABELS)  # fmt: skip
    monitors = Monitors(Recorder(), clock=FakeClock(0.0))
    rt = runtime(reference)
    monitors.record(rt, 200, 0.004, prediction(3, 0.9))
    monitors.record(rt, 503, 0.5, None)
    counters = monitors.counters["m/1"]
    assert (counters.requests, counters.errors) == (2, 1)
    assert counters.outputs == [0.0, 1.0]  # one request's classes, however many texts
    assert counters.window().error_rate == 0.5


def test_one_request_of_many_texts_weighs_as_one_in_the_output_shares():
    monitors = Monitors(Recorder(), clock=FakeClock(0.0))
    rt = runtime({})
    for _ in range(99):
        monitors.record(rt, 200, 0.004, prediction(1, 0.9))  # positive
    monitors.record(rt, 200, 0.004, prediction(64, 0.1))  # one batch, all negative
    assert monitors.counters["m/1"].window().output_shares == pytest.approx((0.01, 0.99))


def test_drift_is_published_then_marked_stale_when_the_window_drains():
    reference = reference_stats("text-classification", np.full(100, 10), np.zeros(100),
                                np.tile([0.2, 0.8], (100, 1)), LABELS)  # fmt: skip
    clock, recorder = FakeClock(0.0), Recorder()
    monitors = Monitors(recorder, clock=clock, publish_interval_s=1.0)
    rt = runtime(reference)
    monitors.record(rt, 200, 0.004, prediction(60, 0.1))  # the opposite class: big drift
    assert recorder.drifts[-1][("predicted_class", "psi")] > 0.25
    clock.now = 10_000.0  # everything in the window has aged out
    monitors.record(rt, 200, 0.004, prediction(1, 0.9))
    assert math.isnan(recorder.drifts[-1][("predicted_class", "psi")])


def test_requests_read_later_count_and_drift_as_if_added_one_by_one():
    reference = reference_stats("text-classification", np.full(100, 10), np.zeros(100),
                                np.tile([0.2, 0.8], (100, 1)), LABELS)  # fmt: skip
    rt = runtime(reference)
    later_clock, each_clock = FakeClock(0.0), FakeClock(0.0)
    later = Monitors(Recorder(), clock=later_clock, publish_interval_s=1e9)
    each = Monitors(Recorder(), clock=each_clock, publish_interval_s=1e9)
    for i in range(80):
        later_clock.now = each_clock.now = float(i)
        request = prediction(1 + i % 3, 0.9 if i % 4 else 0.1)
        status, seconds = (503, 0.5) if i % 10 == 0 else (200, 0.001 * i)
        later.record(rt, status, seconds, None if status == 503 else request)
        each.record(rt, status, seconds, None if status == 503 else request)
        assert each.counters["m/1"].requests == i + 1  # read: nothing waits
    assert len(later._backlog)  # the first request's publish took only the first in
    later_clock.now = each_clock.now = 80.0
    assert later.counters["m/1"].to_dict() == each.counters["m/1"].to_dict()
    texts = sum(1 + i % 3 for i in range(80) if i % 10)
    assert later.windows[("m", "1")].count == each.windows[("m", "1")].count == texts
    assert later.windows[("m", "1")].scores() == each.windows[("m", "1")].scores()
    # Requests 0-49 came more than 600 s before: their texts leave by when they came
    later_clock.now = each_clock.now = 650.0
    young = sum(1 + i % 3 for i in range(50, 80) if i % 10)
    assert later.windows[("m", "1")].count == each.windows[("m", "1")].count == young


def test_waiting_requests_are_bounded():
    monitors = Monitors(Recorder(), clock=FakeClock(0.0), publish_interval_s=1e9)
    rt = runtime({})
    for _ in range(3 * MAX_REQUESTS):
        monitors.record(rt, 200, 0.004, prediction(1, 0.9))
    assert len(monitors._backlog) < MAX_REQUESTS
    assert monitors._counters["m/1"].requests > 2 * MAX_REQUESTS
    assert monitors.counters["m/1"].requests == 3 * MAX_REQUESTS
