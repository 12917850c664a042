"""Many models on one Triton with a budget of loaded versions (issue 35): a stack of its
own with ``triton.max_loaded_versions`` 3 and ``triton.idle_unload_s``, serving more
tiny models than that, round-robin traffic over all of them beside a steady hot model.

Every request gets its answer, Triton's repository index never shows more versions than
the budget, and the cold starts' p50/p99 (``x-cold-start``) and the hot model's p99 are
printed (docs/many-models.md has a run's figures). MANY_MODELS=N registers N models
(10 by default); MANY_MODELS_ROUNDS=R sends R rounds over them (3 by default).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Load, Stack, running_stack, stack_env, wait_for

from infergate.registry import Registry
from infergate.triton.client import TritonControl
from infergate.versions import triton_model_name
from tiny_models import tiny_bert

pytestmark = pytest.mark.e2e

BUDGET = 3
IDLE_UNLOAD_S = 20
COLD_START_TIMEOUT_S = 60
COUNT = int(os.environ.get("MANY_MODELS", "10"))
ROUNDS = int(os.environ.get("MANY_MODELS_ROUNDS", "3"))
HOT = "hot"
TASK = "text-classification"
# Triton holds a version in these states: the budget counts them all.
HELD = ("READY", "LOADING", "UNLOADING")


def names() -> list[str]:
    return [f"many-{i}" for i in range(COUNT)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state_dir = tmp_path_factory.mktemp("many-models")
    env = stack_env(state_dir)
    env["INFERGATE_PROMETHEUS__ENABLED"] = "false"
    env["INFERGATE_TRITON__MAX_LOADED_VERSIONS"] = str(BUDGET)
    env["INFERGATE_TRITON__IDLE_UNLOAD_S"] = str(IDLE_UNLOAD_S)
    env["INFERGATE_FRONTEND__COLD_START_TIMEOUT_S"] = str(COLD_START_TIMEOUT_S)
    with running_stack(state_dir, env) as running:
        started = time.monotonic()
        register_all(running, state_dir)
        print(f"\nregistered {COUNT + 1} models in {time.monotonic() - started:.1f} s")
        with httpx.Client(base_url=running.url, timeout=30) as client:
            wanted = {HOT, *names()}
            wait_for(lambda: wanted <= listed(client).keys(), 300, "every model served")
        print(f"all served {time.monotonic() - started:.1f} s after the first registration")
        yield running


def register_all(stack: Stack, state_dir: Path) -> None:
    """One tiny BERT through `infergate register`, then its files again under every other
    name (MLflow calls only: an export per model would cost ~20 s each here)."""
    import mlflow

    folder = tiny_bert(state_dir / "source", TASK)
    stack.register(folder, HOT, TASK, "--alias", "champion")
    registry = Registry(stack.mlflow)
    files = Path(
        mlflow.artifacts.download_artifacts(
            registry.version_source(HOT, "1"),
            dst_path=str(state_dir / "files"),
            tracking_uri=stack.mlflow,
        )
    )
    for name in names():
        registry.register(name, TASK, files, metrics={}, params={}, tags={}, alias="champion")


def listed(client: httpx.Client) -> dict[str, bool]:
    """Served model -> whether its version is loaded, as /v1/models says."""
    answer = client.get("/v1/models")
    if answer.status_code != 200:
        return {}
    return {m["name"]: m["versions"][0]["loaded"] for m in answer.json()["models"]}


class Holdings:
    """Triton's repository index sampled every 0.1 s: the most versions held at once."""

    def __init__(self, triton: TritonControl) -> None:
        self.triton = triton
        self.most = 0
        self.samples = 0
        self._stop = threading.Event()

    def held(self) -> list[str]:
        return sorted(m for m, state in self.triton.loaded_models().items() if state in HELD)

    def run(self) -> None:
        while not self._stop.is_set():
            self.most = max(self.most, len(self.held()))
            self.samples += 1
            time.sleep(0.1)

    def __enter__(self) -> Holdings:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def test_many_models_within_a_budget_every_request_answered(stack: Stack) -> None:
    triton = TritonControl(f"127.0.0.1:{stack.env['INFERGATE_TRITON__GRPC_PORT']}")
    client = httpx.Client(base_url=stack.url, timeout=COLD_START_TIMEOUT_S + 30)
    hot_body = {"inputs": ["a steady stream of happy words"]}
    hot = Load(lambda: client.post(f"/v1/models/{HOT}/predict", json=hot_body), interval_s=0.05)
    statuses: dict[int, int] = {}
    cold_s: list[float] = []
    refusals: dict[int, str] = {}  # the first body of each status but 200
    try:
        # Loaded first (registering the others may have evicted it): "alone" below is
        # the hot model's steady latency, not its cold start.
        assert client.post(f"/v1/models/{HOT}/predict", json=hot_body).status_code == 200
        with Holdings(triton) as holdings:
            with hot:
                time.sleep(5)  # the hot model alone first: its quiet latency
                quiet = len(hot.answers)
                for _ in range(ROUNDS):
                    for name in names():
                        answer = client.post(
                            f"/v1/models/{name}/predict", json={"inputs": ["good movie"]}
                        )
                        statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
                        if answer.status_code != 200:
                            refusals.setdefault(answer.status_code, answer.text[:300])
                        if "x-cold-start" in answer.headers:
                            cold_s.append(float(answer.headers["x-cold-start"]))
            held_at_end = holdings.held()
        hot_quiet = [s for _, s, _, _ in hot.answers[:quiet]]
        hot_loaded = [s for _, s, _, _ in hot.answers[quiet:]]
        hot_statuses = {status for _, _, status, _ in hot.answers}
        sent = ROUNDS * COUNT
        assert statuses == {200: sent}, (statuses, refusals)
        assert cold_s, "no answer had an x-cold-start header"
        print(
            f"\n{COUNT} models + {HOT}, budget {BUDGET}: {sent} round-robin requests "
            f"{statuses}, {len(cold_s)} cold starts: p50 {statistics.median(cold_s):.2f} s, "
            f"p99 {percentile(cold_s, 0.99):.2f} s, max {max(cold_s):.2f} s; "
            f"most versions Triton held at once {holdings.most} ({holdings.samples} samples); "
            f"{HOT}: {len(hot.answers)} requests {hot_statuses}, p50/p99 "
            f"{statistics.median(hot_quiet) * 1e3:.1f}/{percentile(hot_quiet, 0.99) * 1e3:.1f} ms "
            f"alone, {statistics.median(hot_loaded) * 1e3:.1f}/"
            f"{percentile(hot_loaded, 0.99) * 1e3:.1f} ms while the others load"
        )
        assert hot_statuses == {200}, hot.failures
        assert holdings.most <= BUDGET and len(held_at_end) <= BUDGET
        assert triton_model_name(HOT, "1") in held_at_end  # used all along: never the LRU
        # With two slots for ten models in rotation, nearly every request is a cold start.
        assert len(cold_s) >= sent // 2
        assert percentile(cold_s, 0.99) < COLD_START_TIMEOUT_S / 2
        # The listing says which versions are loaded, as Triton does (a replica hears
        # of loads and unloads within a second).
        wait_for(
            lambda: (
                {triton_model_name(n, "1") for n, up in listed(client).items() if up}
                == set(holdings.held())
            ),
            10,
            "the listing's loaded flags match Triton",
        )
    finally:
        client.close()
        triton.close()


def test_idle_versions_are_unloaded_and_the_next_request_loads_them_again(stack: Stack) -> None:
    triton = TritonControl(f"127.0.0.1:{stack.env['INFERGATE_TRITON__GRPC_PORT']}")
    try:
        holdings = Holdings(triton)
        wait_for(lambda: not holdings.held(), IDLE_UNLOAD_S + 30, "every idle version unloaded")
        with httpx.Client(base_url=stack.url, timeout=COLD_START_TIMEOUT_S + 30) as client:
            answer = client.post(f"/v1/models/{HOT}/predict", json={"inputs": ["hello"]})
            assert answer.status_code == 200 and float(answer.headers["x-cold-start"]) > 0
            assert holdings.held() == [triton_model_name(HOT, "1")]
    finally:
        triton.close()
