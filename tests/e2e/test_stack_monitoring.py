"""Every dashboard panel's query, run against the real Prometheus scraping the real stack
after the traffic of the other e2e modules (demo models, bad inputs, canary rollouts)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from conftest import Stack, clone_version, predict
from mlflow import MlflowClient

from infergate.dashboards.generate import render_all
from infergate.dashboards.promql import expand
from infergate.registry import Registry
from tiny_models import tiny_bert, tiny_marian

pytestmark = pytest.mark.e2e
# (task, model name, labels, request parameters) of a tiny model for each output panel
# the demo models lack.
OTHER_TASKS = [
    ("text-ranking", "monitored-rerank", ("relevance",), {"query": "film"}),
    ("sparse-embedding", "monitored-splade", ("sad", "happy"), {}),
    ("token-classification", "monitored-ner", ("O", "B-PER", "I-PER", "B-LOC"), {}),
]
# (model name, request parameters) of the tiny translation model.
TRANSLATION = ("monitored-translate", {"max_decoding_length": 8})


# Panels of a feature the session stack runs without: load on demand needs a budget
# (triton.max_loaded_versions), which would make the other modules' requests cold starts.
# Their queries are still run here (valid PromQL); tests/e2e/test_many_models.py runs the
# feature.
WITHOUT_DATA_HERE = {
    "Loaded versions",
    "Cold starts, last 5 min",
    "Load on demand, p50 / p99",
    "Unloads per second",
}


def panel_queries() -> list[tuple[str, str, str]]:
    found = []
    for board, text in render_all().items():
        for panel in json.loads(text)["panels"]:
            for target in panel.get("targets", []):
                found.append((board, panel["title"], target["expr"]))
    return found


def test_every_panel_query_returns_data(stack: Stack, http: httpx.Client, tmp_path):
    # The other tasks' output panels need their models: a tiny one each.
    champion = ("--precision", "fp32", "--alias", "champion")
    for task, name, labels, _ in OTHER_TASKS:
        stack.register(tiny_bert(tmp_path / name, task, labels=labels), name, task, *champion)
    # The translation panels (output tokens, decoding time per token) need a seq2seq model.
    marian = tiny_marian(tmp_path / "marian")
    stack.register(marian, TRANSLATION[0], "translation", *champion)
    # The rollout panels need a canary: sentiment gets one, at half the traffic.
    canary = clone_version(Registry(stack.mlflow), "sentiment", "1", tmp_path)
    started = stack.cli("canary", "start", "sentiment", "--version", canary, "--weight", "50",
                        "--manual")  # fmt: skip
    assert started.returncode == 0, started.stderr
    # The shadow stage's panels need a canary in shadow: the ranker gets a copy of itself,
    # held there (it would pass after 30 texts) by a pair minimum it never reaches.
    ranker = OTHER_TASKS[0][1]
    MlflowClient(stack.mlflow).set_registered_model_tag(
        ranker, "infergate.rollout.policy.min_pairs", str(10**9)
    )
    shadowed = clone_version(Registry(stack.mlflow), ranker, "1", tmp_path / "shadowed")
    started = stack.cli("canary", "start", ranker, "--version", shadowed)
    assert started.returncode == 0, started.stderr
    try:
        check_every_panel(stack, http)
    finally:
        assert stack.cli("canary", "rollback", "sentiment").returncode == 0
        assert stack.cli("canary", "rollback", ranker).returncode == 0


def check_every_panel(stack: Stack, http: httpx.Client) -> None:
    state = (stack.state_dir / "stack.json").read_text()
    assert "prometheus" in state, "Prometheus is not running (make test installs it)"
    url = f"http://127.0.0.1:{stack.env['INFERGATE_PROMETHEUS__PORT']}/api/v1/query"
    queries = panel_queries()
    assert len(queries) > 20
    assert {title for _, title, _ in queries} >= WITHOUT_DATA_HERE  # none stale
    empty: list[str] = []
    deadline = time.monotonic() + 90  # Ray's agent exports every few seconds, scrapes 5 s
    while True:
        # Fresh samples for every rate() window, and past the drift windows' 50 texts.
        for model in ("sentiment", "embed"):
            predict(http, model, ["I love this film", "This is terrible"] * 16)
        predict(http, "sentiment", "good " * 3000)  # cut at the max length: the truncation panel
        for _, name, _, parameters in OTHER_TASKS:  # 503 until the new champion is served
            predict(http, name, ["a good film", "bad food"] * 16, parameters=parameters)
        predict(http, TRANSLATION[0], ["a good film", "bad food"] * 16, parameters=TRANSLATION[1])
        empty = []
        for board, title, expr in queries:
            body = httpx.get(url, params={"query": expand(expr, rate_interval="1m")}).json()
            assert body["status"] == "success", f"{board}/{title}: {body.get('error')}"
            if not body["data"]["result"] and title not in WITHOUT_DATA_HERE:
                empty.append(f"{board}/{title}: {expr}")
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(5)
    # A metric whose label sets outgrew Ray's agent loses series (docs/monitoring.md#limits):
    # say so rather than only that its panels are empty.
    overflow = (
        'count by (__name__) ({__name__=~"infergate_.+", otel_metric_overflow="true"}'
        ' or {__name__=~"infergate_.+", otel_metrics_overflow="true"})'
    )
    overflowed = httpx.get(url, params={"query": overflow}).json()["data"]["result"]
    assert not overflowed, f"Ray's agent folded label sets into overflow series: {overflowed}"
    assert not empty, "panels without data:\n" + "\n".join(empty)
