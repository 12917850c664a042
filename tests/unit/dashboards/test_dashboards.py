"""The dashboards generated from code: the committed JSON is current, every panel has a
query, and every metric is ours (metrics.py) or a known exporter's. That every query is
valid PromQL is checked against a real Prometheus in tests/integration."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from dashboard_queries import DASHBOARDS, GRAFANA, expressions, panels, variable_selectors
from infergate.dashboards import cli
from infergate.dashboards.builders import DATASOURCE_UID, FOLDER_UID, Panel
from infergate.dashboards.generate import DASHBOARDS_DIR, check, generate
from infergate.dashboards.promql import expand, known_metric_names
from infergate.errors import DashboardError
from prometheus_server import metric_names


def test_committed_dashboards_are_what_the_code_generates():
    assert check(DASHBOARDS_DIR) == [], "run `python -m infergate.dashboards generate`"
    assert sorted(p.name for p in DASHBOARDS_DIR.glob("*.json")) == sorted(DASHBOARDS)


def test_check_reports_stale_missing_and_unknown_files(tmp_path):
    generate(tmp_path)
    assert check(tmp_path) == []
    (tmp_path / "model.json").write_text("{}")
    (tmp_path / "backend.json").unlink()
    (tmp_path / "old.json").write_text("{}")
    problems = "\n".join(check(tmp_path))
    assert "model.json differs" in problems
    assert "backend.json is missing" in problems
    assert "old.json is not generated" in problems


def test_dashboard_structure():
    uids = [d["uid"] for d in DASHBOARDS.values()]
    assert len(set(uids)) == len(uids) == 4
    for dashboard in DASHBOARDS.values():
        assert dashboard["schemaVersion"] == 39
        assert dashboard["id"] is None
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["current"]["value"] == DATASOURCE_UID
        assert variables["model"]["definition"].startswith("label_values(")
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(set(ids)) == len(ids)
        for panel in dashboard["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
    for name in ("overview", "model", "backend"):
        names = {v["name"] for v in DASHBOARDS[f"{name}.json"]["templating"]["list"]}
        assert names == {"datasource", "model", "version"}


def test_panels_do_not_overlap():
    for dashboard in DASHBOARDS.values():
        cells: set[tuple[int, int]] = set()
        for panel in dashboard["panels"]:
            g = panel["gridPos"]
            mine = {
                (x, y)
                for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])
            }
            assert not cells & mine, f"{dashboard['title']}: {panel['title']} overlaps"
            cells |= mine


def test_every_panel_has_a_query_on_the_datasource_variable():
    for name, panel in panels():
        assert panel["targets"], f"{name}: {panel['title']} has no query"
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert target["expr"].strip(), f"{name}: {panel['title']}"
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    with pytest.raises(ValueError, match="no query"):
        Panel("empty", ())


def test_expected_panels_exist():
    titles = {panel["title"] for _, panel in panels()}
    for title in (
        "Requests per second",
        "Error rate (5xx share)",
        "Latency p50 / p95 / p99 (whole request)",
        "Latency heatmap (whole request)",
        "Sequences per second",
        "Predicted class distribution",
        "Drift (PSI against the registration reference)",
        "Champion: error rate",
        "Canary: p95 latency",
        "Traffic weight",
        "Rollout decisions",
        "Queue time per request",
        "Batch size (inferences per execution)",
        "Ongoing requests per replica",
        "HTTP requests per second",
    ):
        assert title in titles
    heatmaps = [p for _, p in panels() if p["type"] == "heatmap"]
    assert heatmaps and all(t["format"] == "heatmap" for p in heatmaps for t in p["targets"])
    drift = next(p for _, p in panels() if p["title"].startswith("Drift (PSI"))
    steps = drift["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 0.1, 0.25]


def test_latency_percentiles_come_from_the_buckets():
    latency = next(p for _, p in panels() if p["title"].startswith("Latency p50"))
    for target in latency["targets"]:
        assert target["expr"].startswith("histogram_quantile(")
        assert (
            "sum by (le, model, version) (rate(infergate_request_duration_seconds_bucket{"
            in (target["expr"])
        )


def test_every_metric_is_ours_or_a_known_exporters():
    known = known_metric_names()
    used: set[str] = set()
    for expr in [*expressions(), *variable_selectors()]:
        names = metric_names(expr)
        assert names, f"no metric found in {expr!r}"
        assert names <= known, f"unknown metrics {names - known} in {expr!r}"
        used |= names
    assert used >= {"infergate_requests_total", "infergate_drift_score", "nv_inference_exec_count"}


def test_expand_replaces_grafana_variables():
    assert expand('x{model=~"$model", a=~"${version}"}[$__rate_interval]', rate_interval="30s") == (
        'x{model=~".*", a=~".*"}[30s]'
    )
    with pytest.raises(KeyError, match="unknown"):
        expand("x{a=~'$unknown'}")


def test_grafana_provisioning_matches_the_dashboards():
    datasources = yaml.safe_load((GRAFANA / "datasources" / "infergate.yml").read_text())
    (datasource,) = datasources["datasources"]
    assert datasource["uid"] == DATASOURCE_UID and datasource["type"] == "prometheus"
    providers = yaml.safe_load((GRAFANA / "dashboards" / "infergate.yml").read_text())
    (provider,) = providers["providers"]
    assert provider["folderUid"] == FOLDER_UID and provider["type"] == "file"


def test_generate_check_command(tmp_path, capsys):
    assert cli.main(["generate", "--out", str(tmp_path)]) == 0
    assert cli.main(["generate", "--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "overview.json").write_text("{}")
    assert cli.main(["generate", "--check", "--out", str(tmp_path)]) == 1
    assert "overview.json differs" in capsys.readouterr().err
    with pytest.raises(DashboardError, match="not current"):
        cli.cmd_generate(argparse.Namespace(check=True, out=tmp_path))


def test_add_commands_wires_into_a_parser():
    parser = argparse.ArgumentParser(prog="infergate")
    cli.add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["dashboards", "snapshot", "--out", "x", "--minutes", "5"])
    assert args.func is cli.cmd_snapshot and args.minutes == 5 and args.out == Path("x")
    args = parser.parse_args(
        ["dashboards", "push", "--grafana-url", "http://g:3000", "--token", "t"]
    )
    assert args.func is cli.cmd_push and args.prometheus_url is None
    args = parser.parse_args(["dashboards", "generate", "--check"])
    assert args.func is cli.cmd_generate and args.check
