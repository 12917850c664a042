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
