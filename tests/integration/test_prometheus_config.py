"""deployments/prometheus.yml and deployments/alerts.yml, checked by promtool and a real
Prometheus: the rules parse, the rendered config (alerts.yml beside it, as the stack lays
it out) is valid, the alert unit tests pass, and the ray job's relabelling does what
metrics.py promises."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily

from infergate.config import PROJECT_ROOT
from infergate.dashboards.promql import known_metric_names
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


def test_alert_rules_use_our_metrics_or_known_exporters():
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    for rule in rules:
        names = metric_names(rule["expr"])
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
        buckets = GaugeMetricFamily(
            "ray_infergate_request_duration_seconds_bucket", "Time per stage.",
            labels=[*stage, "le"],
        )  # fmt: skip
        # Per scrape: 10 requests at or under 5 ms, 30 at or under 10 ms, none above.
        for le, count in (("0.005", 10), ("0.01", 40), ("+Inf", 40)):
            buckets.add_metric([*stage.values(), le], count * self.scrapes)
        yield buckets
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
