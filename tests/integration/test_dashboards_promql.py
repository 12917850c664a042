"""The dashboards' queries against what they query: every expression is valid PromQL
(run through a real Prometheus: promtool 2.42 has no query-check command), and the Ray
Serve metrics they read exist in the installed Ray."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dashboard_queries import expressions, variable_selectors
from infergate.dashboards.promql import EXTERNAL_METRICS, expand
from prometheus_server import needs_prometheus, query, running_prometheus


@needs_prometheus
def test_every_query_is_valid_promql(tmp_path):
    config = "global:\n  scrape_interval: 5s\nscrape_configs: []\n"
    with running_prometheus(config, tmp_path) as url:
        for expr in [*expressions(), *variable_selectors()]:
            body = query(url, expand(expr))
            assert body["status"] == "success", f"{expr}\n-> {body.get('error')}"
        # The check can fail: a broken expression is reported.
        assert query(url, "sum by (le (rate(x[1m]))")["status"] == "error"


def test_the_ray_serve_metrics_we_read_exist_in_ray():
    spec = importlib.util.find_spec("ray")
    assert spec and spec.submodule_search_locations
    serve = Path(next(iter(spec.submodule_search_locations))) / "serve" / "_private"
    source = "\n".join(p.read_text() for p in serve.rglob("*.py"))
    for name in EXTERNAL_METRICS["ray"]:
        assert f'"{name.removeprefix("ray_")}"' in source, name


@needs_prometheus
def test_a_series_first_increment_counts_on_the_recent_panels(tmp_path):
    """``increase_seen`` on Prometheus's own evaluator (promtool's unit tests): a series
    born inside the window gives its value, which ``increase()`` misses; an older one its
    growth; one reset inside the window its value since the reset."""
    import subprocess

    from infergate.dashboards.promql import increase_seen
    from prometheus_server import PROMTOOL

    expr = f"sum by (model) ({increase_seen('infergate_cold_starts_total')})"
    series = {
        "new": "_ _ _ 1 1 1 1 1 1 1",
        "old": "1 1 1 1 1 1 1 1 2 2",
        "reset": "3 3 3 3 3 3 3 1 1 1",
    }
    inputs = "".join(
        f"      - series: 'infergate_cold_starts_total{{model=\"{m}\"}}'\n        values: '{v}'\n"
        for m, v in series.items()
    )

    def check(at: str, expected: dict[str, int], query: str = expr) -> str:
        samples = "".join(
            f"          - labels: '{{model=\"{m}\"}}'\n            value: {n}\n"
            for m, n in expected.items()
        )
        return f"      - expr: '{query}'\n        eval_time: {at}\n        exp_samples:\n{samples}"

    tests = (
        check("5m", {"new": 1, "old": 0, "reset": 0})
        + check("9m", {"new": 0, "old": 1, "reset": 1})
        # What the panels did before: the first cold start is not there.
        + check(
            "5m",
            {"new": 0, "old": 0, "reset": 0},
            "sum by (model) (increase(infergate_cold_starts_total[5m]))",
        )
    )
    spec = tmp_path / "increase_seen_test.yml"
    spec.write_text(
        "rule_files: []\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n"
        f"    input_series:\n{inputs}    promql_expr_test:\n{tests}"
    )
    assert PROMTOOL is not None
    run = subprocess.run([PROMTOOL, "test", "rules", str(spec)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
