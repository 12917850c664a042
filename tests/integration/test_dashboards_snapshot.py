"""``snapshot`` against a real Prometheus that scrapes a tiny prometheus_client exporter
of infergate_* series (two versions of a sentiment model, one failing and drifting)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from infergate.dashboards import cli
from infergate.dashboards.boards import KEY_PANELS
from infergate.dashboards.builders import Panel, Query
from infergate.dashboards.snapshot import snapshot
from infergate.errors import DashboardError
from infergate.observe import metrics as m
from prometheus_server import needs_prometheus, query, running_prometheus, wait_for

pytestmark = needs_prometheus

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TAB_BLUE = np.array([31, 119, 180]) / 255  # matplotlib's first line colour


class FrontendLike:
    """Counters that grow with time, so rate() has something to say; gauges that wobble."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        t = time.monotonic() - self.started
        requests = CounterMetricFamily(m.REQUESTS.full_name.removesuffix("_total"), "",
                                       labels=["model", "version", "status"])  # fmt: skip
        requests.add_metric(["sentiment", "1", "200"], 20 * t)
        requests.add_metric(["sentiment", "2", "200"], 4 * t)
        requests.add_metric(["sentiment", "2", "503"], 0.5 * t)
        yield requests
        duration = HistogramMetricFamily(
            m.DURATION.full_name, "", labels=["model", "version", "stage"]
        )
        for version, shares in (("1", (0.6, 0.95, 1.0)), ("2", (0.2, 0.7, 1.0))):
            n = 20 * t
            buckets = [("0.01", shares[0] * n), ("0.05", shares[1] * n), ("0.25", shares[2] * n),
                       ("+Inf", n)]  # fmt: skip
            duration.add_metric(["sentiment", version, "total"], buckets, sum_value=0.02 * n)
        yield duration
        classes = CounterMetricFamily(m.PREDICTED_CLASS.full_name.removesuffix("_total"), "",
                                      labels=["model", "version", "class"])  # fmt: skip
        classes.add_metric(["sentiment", "1", "positive"], 12 * t)
        classes.add_metric(["sentiment", "1", "negative"], 8 * t)
        yield classes
        drift = GaugeMetricFamily(m.DRIFT.full_name, "",
                                  labels=["model", "version", "feature", "method"])  # fmt: skip
        wobble = 0.02 * np.sin(t)
        drift.add_metric(["sentiment", "1", "token_length", "psi"], 0.05 + wobble)
        drift.add_metric(["sentiment", "2", "predicted_class", "psi"], 0.3 + wobble)
        yield drift


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    registry = CollectorRegistry()
    registry.register(FrontendLike())
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    config = (
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: ray\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{server.server_port}']\n"
    )
    try:
        with running_prometheus(config, tmp_path_factory.mktemp("prometheus")) as url:
            # A few samples per series, so rate() and the lines have points to draw.
            wait_for(
                lambda: query(url, f"count_over_time({m.DRIFT.full_name}[1m]) >= 4")["data"][
                    "result"
                ],
                30,
                "four scrapes of the exporter",
            )
            yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def assert_png(path: Path) -> np.ndarray:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = imread(path)  # decodes the whole file: a truncated PNG fails here
    assert image.shape[0] > 300 and image.shape[1] > 800
    return image


def has_colour(image: np.ndarray, colour: np.ndarray) -> bool:
    return bool((np.abs(image[..., :3] - colour).max(axis=-1) < 0.02).any())


def test_snapshot_renders_the_key_panels(prometheus, tmp_path):
    paths = snapshot(prometheus, tmp_path / "png", minutes=1)
    assert [p.name for p in paths] == [
        "requests-per-second.png",
        "latency-p50-p95-p99-whole-request.png",
        "predicted-class-distribution.png",
        "drift-psi-against-the-registration-reference.png",
    ]
    for path in paths:
        image = assert_png(path)
        assert has_colour(image, TAB_BLUE), f"{path.name} has no data line"


def test_a_panel_without_data_still_gets_a_png(prometheus, tmp_path):
    empty = Panel("Nothing here", (Query('infergate_requests_total{model="absent"}'),))
    (path,) = snapshot(prometheus, tmp_path, minutes=1, panels=[empty])
    assert not has_colour(assert_png(path), TAB_BLUE)


def test_snapshot_command(prometheus, tmp_path, capsys):
    code = cli.main(["snapshot", "--out", str(tmp_path), "--prometheus-url", prometheus,
                     "--minutes", "1"])  # fmt: skip
    assert code == 0
    assert (
        len(capsys.readouterr().out.split()) == len(KEY_PANELS) == len(list(tmp_path.glob("*.png")))
    )


def test_errors_say_what_to_fix(prometheus, tmp_path):
    with pytest.raises(DashboardError, match="cannot reach Prometheus"):
        snapshot("http://127.0.0.1:9", tmp_path, timeout_s=2)
    with pytest.raises(DashboardError, match="rejected the query"):
        snapshot(prometheus, tmp_path, panels=[Panel("Broken", (Query("sum(("),))])
    with pytest.raises(DashboardError, match="at least 1"):
        snapshot(prometheus, tmp_path, minutes=0)
