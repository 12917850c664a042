"""The side-by-side request-path measurement's figures, from its workers' windows."""

import gc
import math

import pytest

from infergate.bench.request_cpu import CollectorClock, per_request_us, summary


def window(requests: int, cpu_s: float, wall_s: float = 0.5) -> dict[str, float]:
    return {"requests": requests, "cpu_s": cpu_s, "wall_s": wall_s}


def test_cpu_per_request_and_per_sequence_over_the_windows():
    windows = [window(100, 0.030), window(200, 0.080), window(100, 0.050), window(0, 0.002)]
    figures = summary(windows, texts=16)
    assert [per_request_us(w) for w in windows[:3]] == pytest.approx([300, 400, 500])
    assert math.isnan(per_request_us(windows[3]))  # no request: no figure, not zero
    assert figures["median_us"] == pytest.approx(400)
    assert figures["least_us"] == pytest.approx(300)
    # Over the run, the idle window's CPU included: 0.162 s for 400 requests
    assert figures["overall_us"] == pytest.approx(405)
    assert figures["overall_per_sequence_us"] == pytest.approx(405 / 16)
    assert figures["req_per_s"] == pytest.approx(400 / 2.0)


def test_the_collectors_time_per_request_over_the_run():
    windows = [window(100, 0.030) | {"gc_s": 0.002, "collections": 3}, window(300, 0.090)]
    figures = summary(windows, texts=1)
    assert figures["gc_us"] == pytest.approx(5.0)  # 2 ms over 400 requests
    assert figures["collections"] == 3  # a window from an older worker has none


def test_the_collector_clock_times_each_collection():
    clock = CollectorClock()
    try:
        gc.collect()
        gc.collect(0)
    finally:
        clock.close()
    assert clock.collections == 2
    assert clock.seconds > 0
    gc.collect()  # no longer counted
    assert clock.collections == 2
