"""deployments/prometheus.yml and deployments/alerts.yml, checked by promtool and a real
Prometheus: the rules parse, the rendered config (alerts.yml beside it, as the stack lays
it out) is valid, the alert unit tests pass, and the ray job's relabelling does what
metrics.py promises."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily

from fakes import answered
from infergate.config import PROJECT_ROOT
from infergate.dashboards.promql import known_metric_names
from infergate.observe import metrics as m
from infergate.stack.processes import free_ports
from prometheus_server import (
    PROMTOOL,
    metric_names,
    needs_prometheus,
    query,
    running_prometheus,
    wait_for,
)

DEPLOYMENTS = PROJECT_ROOT / "deployments"
TEMPLATE = DEPLOYMENTS / "prometheus.yml"
ALERTS = DEPLOYMENTS / "alerts.yml"
RULE_TESTS = Path(__file__).parent / "data" / "alerts_test.yml"

pytestmark = needs_prometheus


def render(ports: dict[str, int] | None = None) -> str:
    """The template with every ${NAME} replaced by 127.0.0.1:PORT (like `infergate up`)."""
    text = TEMPLATE.read_text()
    names = sorted(set(re.findall(r"\$\{(\w+)\}", text)))
    ports = {**dict(zip(names, free_ports(len(names)), strict=True)), **(ports or {})}
    for name, port in ports.items():
        text = text.replace("${" + name + "}", f"127.0.0.1:{port}")
    assert not re.search(r"\$\{\w+\}", text)
    return text


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


def test_alert_rules_pass_promtool_check():
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_config_with_alerts_beside_it_passes_promtool_check(tmp_path):
    config = tmp_path / "prometheus.yml"
    config.write_text(render())
    (tmp_path / "alerts.yml").write_text(ALERTS.read_text())
    result = promtool("check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    rules = sum(len(group["rules"]) for group in yaml.safe_load(ALERTS.read_text())["groups"])
    assert f"SUCCESS: {rules} rules found" in result.stdout


def test_template_keeps_its_jobs_and_placeholders():
    config = yaml.safe_load(TEMPLATE.read_text())
    assert config["rule_files"] == ["alerts.yml"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"triton", "ray", "ingress"}
    assert jobs["triton"]["static_configs"][0]["targets"] == ["${TRITON_METRICS}"]
    assert jobs["ray"]["static_configs"][0]["targets"] == ["${RAY_METRICS}"]
    assert jobs["ingress"]["static_configs"][0]["targets"] == ["${HAPROXY_METRICS}"]


# Rules that watch every series of a job, whatever its metric.
EVERY_METRIC = {"InfergateRayMetricsOverflow"}


def test_alert_rules_use_our_metrics_or_known_exporters():
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    assert {rule["alert"] for rule in rules} >= EVERY_METRIC
    for rule in rules:
        names = metric_names(rule["expr"])
        if rule["alert"] in EVERY_METRIC:
            assert not names and 'job="ray"' in rule["expr"], (rule["alert"], names)
        else:
            assert names and names <= known_metric_names(), (rule["alert"], names)


def test_alert_unit_tests_pass():
    # Drift: PSI 0.3 fires the critical alert, 0.15 the warning, 0.05 nothing; plus the
    # error-rate, p99-latency, Triton-down, no-healthy-replica and canary-rollback rules.
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


# The labels Ray's metrics agent adds to every series it exports.
RAY_LABELS = {
    "Component": "core_worker",
    "NodeAddress": "127.0.0.1",
    "SessionName": "session_2025_01_01_00-00-00_000000_1",
    "Version": "2.60.0",
    "WorkerId": "8f3c",
    "otel_scope_name": "ray",
    "otel_scope_schema_url": "",
    "otel_scope_version": "",
}


class RayAgentLike:
    """What Ray's metrics agent exports for a front-end replica, labels and all: the
    replica's totals are gauges with Prometheus series names (``infergate.observe.telemetry``)."""

    def __init__(self) -> None:
        self.scrapes = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.scrapes += 1
        labels = {**RAY_LABELS, "model": "sentiment", "version": "1", "status": "200"}
        requests = GaugeMetricFamily(
            "ray_infergate_requests_total", "Requests by outcome.", labels=list(labels)
        )
        requests.add_metric(list(labels.values()), 42 * self.scrapes)
        yield requests
        stage = {**RAY_LABELS, "model": "sentiment", "version": "1", "stage": "total"}
        # Per scrape: 10 requests at or under 5 ms, 30 at or under 10 ms, none above. Each
        # bucket is a gauge of its own in Ray (infergate.observe.telemetry.bucket_gauges).
        for i, (le, count) in enumerate((("0.005", 10), ("0.01", 40), ("+Inf", 40))):
            bucket = GaugeMetricFamily(
                f"ray_infergate_request_duration_seconds_bucket_{i:02d}", "Time per stage.",
                labels=[*stage, "le"],
            )  # fmt: skip
            bucket.add_metric([*stage.values(), le], count * self.scrapes)
            yield bucket
        serve_labels = {**RAY_LABELS, "application": "infergate", "deployment": "frontend"}
        healthy = GaugeMetricFamily(
            "ray_serve_deployment_replica_healthy", "Healthy replicas.", labels=list(serve_labels)
        )
        healthy.add_metric(list(serve_labels.values()), 1)
        yield healthy


def test_ray_job_renames_infergate_metrics_and_drops_ray_labels(tmp_path):
    registry = CollectorRegistry()
    registry.register(RayAgentLike())
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        config = render({"RAY_METRICS": server.server_port})
        config = config.replace("scrape_interval: 5s", "scrape_interval: 1s")  # a quick test
        with running_prometheus(config, tmp_path, {"alerts.yml": ALERTS.read_text()}) as url:
            result = wait_for(
                lambda: query(url, "infergate_requests_total")["data"]["result"],
                15,
                "the first scrape of the Ray-like exporter",
            )
            (series,) = result
            labels = series["metric"]
            assert labels["WorkerId"] == "8f3c"  # replicas stay distinct
            assert labels["model"] == "sentiment" and labels["status"] == "200"
            dropped = {
                "SessionName",
                "otel_scope_name",
                "otel_scope_schema_url",
                "otel_scope_version",
            }
            assert not dropped & set(labels)
            assert query(url, "ray_infergate_requests_total")["data"]["result"] == []
            # Each bucket's gauge is named back into one histogram series.
            named = query(url, 'count by (__name__) ({__name__=~"infergate_.+_bucket.*"})')
            names = {r["metric"]["__name__"] for r in named["data"]["result"]}
            assert names == {"infergate_request_duration_seconds_bucket"}
            # The replica's totals behave as a counter and a histogram once scraped.
            buckets = "rate(infergate_request_duration_seconds_bucket[5s])"
            p50 = f"histogram_quantile(0.5, sum by (le) ({buckets}))"
            (median,) = wait_for(
                lambda: query(url, p50)["data"]["result"], 15, "two scrapes of the histogram"
            )
            # The 20th of 40 lies in the (0.005, 0.01] bucket, a third of the way in.
            assert float(median["value"][1]) == pytest.approx(0.005 + 0.005 * 10 / 30)
            (requests,) = query(url, "rate(infergate_requests_total[5s])")["data"]["result"]
            assert float(requests["value"][1]) > 0
            (healthy,) = query(url, "ray_serve_deployment_replica_healthy")["data"]["result"]
            assert "SessionName" not in healthy["metric"]
            assert healthy["metric"]["deployment"] == "frontend"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize("path", [TEMPLATE, ALERTS])
def test_yaml_files_parse(path):
    assert yaml.safe_load(path.read_text())


# Label sets Ray's metrics agent keeps per metric for its life (the OpenTelemetry SDK's
# default; Ray 2.60 sets none of its own). Past it, new sets go to one overflow series.
RAY_LABEL_SETS = 2000


@pytest.fixture(scope="module")
def ray_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Ray (a local cluster of its own) exporting every second, and a Prometheus
    scraping its metrics agent with the repository's config and alerts; the URL of it."""
    import ray

    [port] = free_ports(1)
    ray.init(
        address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
        _metrics_export_port=port, _system_config={"metrics_report_interval_ms": 1000},
    )  # fmt: skip
    config = render({"RAY_METRICS": port})
    for interval in ("scrape_interval", "evaluation_interval"):
        config = config.replace(f"{interval}: 5s", f"{interval}: 1s")  # a quick test
    workdir = tmp_path_factory.mktemp("ray-prometheus")
    try:
        with running_prometheus(config, workdir, {"alerts.yml": ALERTS.read_text()}) as url:
            yield url
    finally:
        ray.shutdown()


def test_a_metric_past_rays_label_set_limit_loses_series_and_fires_the_alert(ray_agent):
    """The driver sets one gauge under 100 more label sets than Ray's agent keeps: the
    agent exports an overflow series in place of the excess, and the alert fires on it."""
    from ray.util.metrics import Gauge

    probe = Gauge("overflow_probe", description="Label sets.", tag_keys=("version", "le"))
    label_sets = RAY_LABEL_SETS + 100

    def firing() -> list[dict]:
        for i in range(label_sets):  # again and again: Ray drops gauges not set lately
            probe.set(1.0, {"version": str(i // 20), "le": str(i % 20)})
        alerts = httpx.get(f"{ray_agent}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        return [
            a for a in alerts
            if a["labels"]["alertname"] == "InfergateRayMetricsOverflow"
            and a["state"] == "firing"
        ]  # fmt: skip

    (alert,) = wait_for(firing, 60, "the overflow alert to fire")
    assert alert["labels"]["metric"] == "ray_overflow_probe"
    assert "2,000 label sets" in alert["annotations"]["description"]
    exported = query(ray_agent, 'count(ray_overflow_probe{otel_metric_overflow!="true"})')
    (kept,) = exported["data"]["result"]
    assert int(kept["value"][1]) <= RAY_LABEL_SETS < label_sets


def test_a_replicas_latency_histograms_stay_whole_past_the_label_set_limit(ray_agent):
    """A replica's own telemetry, through the real agent and scrape: 30 versions' four
    stages of latency are 30 x 4 x 22 = 2,640 bucket series, more than the agent keeps per
    metric; each bucket a metric of its own, every version's histogram arrives whole."""
    from infergate.observe.telemetry import RayTelemetry
    from infergate.serving.runtime import Timings

    versions = [str(v) for v in range(1, 31)]
    buckets = len(m.DURATION.buckets) + 1
    assert len(versions) * len(m.STAGES) * buckets > RAY_LABEL_SETS
    answer = answered(np.ones((1, 8)), timings=Timings(0.001, 0.002, 0.0005))
    telemetry = RayTelemetry()
    for version in versions:
        telemetry.request("many", version, 200, answer, 0.004)
    series = 'count by (version) (infergate_request_duration_seconds_bucket{model="many"})'

    whole = {version: len(m.STAGES) * buckets for version in versions}
    found: dict[str, int] = {}

    def arrived() -> bool:
        telemetry.flush()  # as the replica does every second
        counted = query(ray_agent, series)["data"]["result"]
        found.update({r["metric"]["version"]: int(r["value"][1]) for r in counted})
        return found == whole

    try:
        wait_for(arrived, 60, "every version's latency buckets")
    finally:
        print(f"bucket series per version: {found}")
    overflow = '{__name__=~"infergate_.+", otel_metric_overflow="true"}'
    assert query(ray_agent, overflow)["data"]["result"] == []
    p50 = (
        "histogram_quantile(0.5, sum by (le, version) "
        '(infergate_request_duration_seconds_bucket{model="many", stage="total"}))'
    )
    medians = {r["metric"]["version"]: float(r["value"][1]) for r in
               query(ray_agent, p50)["data"]["result"]}  # fmt: skip
    assert set(medians) == set(versions)
    assert all(0.003 < median <= 0.005 for median in medians.values()), medians
