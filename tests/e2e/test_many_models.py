"""Many models on one Triton with a budget of loaded versions (issue 35): a stack of its
own with ``triton.max_loaded_versions`` 3 and ``triton.idle_unload_s``, serving more
tiny models of two sizes than that, round-robin traffic over all of them beside a steady
hot model, with Prometheus scraping it.

Every request gets its answer, Triton's repository index never shows more versions than
the budget, a version out of Triton is ready (it loads on demand), the load-on-demand
metrics and the Backend dashboard's "Load on demand" panels agree with what the client
saw, and the cold starts' p50/p99 per model size (``x-cold-start``) and the hot model's
p99 are printed (docs/many-models.md has a run's figures).

CI runs 10 models (the ``10-models`` form). The long form, ``MANY_MODELS=100`` (any
count), runs the same tests on that many models; it takes too long for CI, so it is
skipped unless asked for (the skip says why). ``MANY_MODELS_ROUNDS`` sets the rounds of
requests over them (2 for 10 models, 1 for the long form). The variables have no
``INFERGATE_`` prefix: `infergate up` refuses a variable of that prefix that is not a
setting.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as triton_grpc
from conftest import Load, Stack, running_stack, stack_env, wait_for

from infergate.dashboards.generate import render_all
from infergate.dashboards.promql import expand
from infergate.observe.metrics import LOAD_BUCKETS_S
from infergate.registry import Registry
from infergate.triton.client import TritonControl
from infergate.versions import triton_model_name
from tiny_models import tiny_bert

pytestmark = pytest.mark.e2e

BUDGET = 3
IDLE_UNLOAD_S = 20
COLD_START_TIMEOUT_S = 60
LONG_FORM = int(os.environ.get("MANY_MODELS", "0"))
HOT = "hot"
TASK = "text-classification"
# Two sizes of tiny BERT (layers, hidden), alternating over the models: the smallest
# tiny_bert and all-MiniLM-L6's shape (its vocabulary tiny: the graph is the layers).
SIZES = {"2x32": (2, 32), "6x384": (6, 384)}
# Triton holds a version in these states: the budget counts them all.
HELD = ("READY", "LOADING", "UNLOADING")
FORMS = [
    pytest.param(10, id="10-models"),
    pytest.param(
        LONG_FORM or 100,
        id="long-form",
        marks=[
            pytest.mark.skipif(
                not LONG_FORM,
                reason="the long form (100 models: about 100 registrations, a load each "
                "and a cold start of ~3.5 s per request, some 15-20 min here, too long for "
                "CI) runs on demand: MANY_MODELS=100 pytest "
                "tests/e2e/test_many_models.py -k long-form",
            ),
            pytest.mark.timeout(4 * 3600),
        ],
    ),
]


@pytest.fixture(scope="module", params=FORMS)
def count(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def names(count: int) -> list[str]:
    return [f"many-{i}" for i in range(count)]


def size_of(name: str) -> str:
    """The size of model ``name``: ``hot`` and even numbers small, odd ones larger."""
    sizes = list(SIZES)
    return sizes[0] if name == HOT else sizes[int(name.rsplit("-", 1)[1]) % 2]


def rounds(count: int) -> int:
    default = "1" if count > 10 else "2"
    return int(os.environ.get("MANY_MODELS_ROUNDS", default))


@pytest.fixture(scope="module")
def stack(count: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state_dir = tmp_path_factory.mktemp("many-models")
    env = stack_env(state_dir)
    env["INFERGATE_TRITON__MAX_LOADED_VERSIONS"] = str(BUDGET)
    env["INFERGATE_TRITON__IDLE_UNLOAD_S"] = str(IDLE_UNLOAD_S)
    env["INFERGATE_FRONTEND__COLD_START_TIMEOUT_S"] = str(COLD_START_TIMEOUT_S)
    with running_stack(state_dir, env) as running:
        assert "prometheus" in (state_dir / "stack.json").read_text(), (
            "Prometheus is not running (make test installs it)"
        )
        started = time.monotonic()
        register_all(running, state_dir, count)
        print(f"\nregistered {count + 1} models in {time.monotonic() - started:.1f} s")
        with httpx.Client(base_url=running.url, timeout=30) as client:
            wanted = {HOT, *names(count)}
            wait_for(lambda: wanted <= listed(client).keys(), 300 + 5 * count, "all served")
        print(f"all served {time.monotonic() - started:.1f} s after the first registration")
        yield running


def register_all(stack: Stack, state_dir: Path, count: int) -> None:
    """One tiny BERT of each size through `infergate register` (``hot`` and ``many-1``),
    then their files again under every other name (MLflow calls only: an export per
    model would cost ~20 s each here)."""
    import mlflow

    registry = Registry(stack.mlflow)
    files: dict[str, Path] = {}
    for size, first in zip(SIZES, (HOT, "many-1"), strict=True):
        layers, hidden = SIZES[size]
        folder = tiny_bert(state_dir / "source" / size, TASK, layers=layers, hidden=hidden)
        stack.register(folder, first, TASK, "--alias", "champion")
        files[size] = Path(
            mlflow.artifacts.download_artifacts(
                registry.version_source(first, "1"),
                dst_path=str(state_dir / "files" / size),
                tracking_uri=stack.mlflow,
            )
        )
    for name in names(count):
        if name != "many-1":
            registry.register(
                name, TASK, files[size_of(name)], metrics={}, params={}, tags={},
                alias="champion",
            )  # fmt: skip


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


class Prometheus:
    """Instant queries to the stack's Prometheus."""

    def __init__(self, stack: Stack) -> None:
        self.url = f"http://127.0.0.1:{stack.env['INFERGATE_PROMETHEUS__PORT']}/api/v1/query"

    def query(self, expr: str) -> list[dict]:
        body = httpx.get(self.url, params={"query": expr}, timeout=10).json()
        assert body["status"] == "success", f"{expr}: {body.get('error')}"
        return body["data"]["result"]

    def by(self, label: str, expr: str) -> dict[str, float]:
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in self.query(expr)}

    def settled(self, label: str, expr: str, expected: dict[str, float]) -> dict[str, float]:
        """``by(label, expr)`` once it equals ``expected`` (Ray exports every few seconds,
        Prometheus scrapes every 5), or what it was after 60 s."""
        deadline = time.monotonic() + 60
        while (seen := self.by(label, expr)) != expected and time.monotonic() < deadline:
            time.sleep(2)
        return seen


def load_on_demand_panels() -> list[tuple[str, str]]:
    """(title, query) of the Backend dashboard's "Load on demand" row."""
    panels = json.loads(render_all()["backend.json"])["panels"]
    found, inside = [], False
    for panel in panels:
        if panel.get("type") == "row":
            inside = panel["title"] == "Load on demand"
        elif inside:
            found += [(panel["title"], target["expr"]) for target in panel["targets"]]
    assert len(found) >= 4, found
    return found


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def test_many_models_within_a_budget_every_request_answered(stack: Stack, count: int) -> None:
    triton = TritonControl(f"127.0.0.1:{stack.env['INFERGATE_TRITON__GRPC_PORT']}")
    client = httpx.Client(base_url=stack.url, timeout=COLD_START_TIMEOUT_S + 30)
    hot_body = {"inputs": ["a steady stream of happy words"]}
    cold_by_model: Counter[str] = Counter()  # every x-cold-start answer, the hot model's too
    waits: list[float] = []  # their x-cold-start seconds
    cold_at: list[tuple[float, str]] = []  # when each came (monotonic), and its model

    def send(name: str, body: dict) -> httpx.Response:
        answer = client.post(f"/v1/models/{name}/predict", json=body)
        if "x-cold-start" in answer.headers:
            cold_by_model[name] += 1
            waits.append(float(answer.headers["x-cold-start"]))
            cold_at.append((time.monotonic(), name))
        return answer

    hot = Load(lambda: send(HOT, hot_body), interval_s=0.05)
    statuses: dict[int, int] = {}
    cold_s: dict[str, list[float]] = {size: [] for size in SIZES}  # round-robin, by size
    refusals: dict[int, str] = {}  # the first body of each status but 200
    sent = rounds(count) * count
    try:
        # Loaded first (registering the others may have evicted it): "alone" below is
        # the hot model's steady latency, not its cold start.
        assert send(HOT, hot_body).status_code == 200
        with Holdings(triton) as holdings:
            with hot:
                time.sleep(5)  # the hot model alone first: its quiet latency
                quiet = len(hot.answers)
                for _ in range(rounds(count)):
                    for name in names(count):
                        answer = send(name, {"inputs": ["good movie"]})
                        statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
                        if answer.status_code != 200:
                            refusals.setdefault(answer.status_code, answer.text[:300])
                        if "x-cold-start" in answer.headers:
                            cold_s[size_of(name)].append(float(answer.headers["x-cold-start"]))
            held_at_end = holdings.held()
        hot_quiet = [s for _, s, _, _ in hot.answers[:quiet]]
        hot_loaded = [s for _, s, _, _ in hot.answers[quiet:]]
        hot_statuses = {status for _, _, status, _ in hot.answers}
        every_cold = [s for values in cold_s.values() for s in values]
        assert statuses == {200: sent}, (statuses, refusals)
        assert all(cold_s.values()), f"a size had no answer with x-cold-start: {cold_s}"
        per_size = "; ".join(
            f"{size} ({len(v)}): p50 {statistics.median(v):.2f} s, "
            f"p99 {percentile(v, 0.99):.2f} s, max {max(v):.2f} s"
            for size, v in cold_s.items()
        )
        print(
            f"\n{count} models + {HOT}, budget {BUDGET}: {sent} round-robin requests "
            f"{statuses}, {len(every_cold)} cold starts: p50 "
            f"{statistics.median(every_cold):.2f} s, p99 {percentile(every_cold, 0.99):.2f} s; "
            f"by size: {per_size}; "
            f"most versions Triton held at once {holdings.most} ({holdings.samples} samples); "
            f"{HOT}: {len(hot.answers)} requests {hot_statuses}, p50/p99 "
            f"{statistics.median(hot_quiet) * 1e3:.1f}/{percentile(hot_quiet, 0.99) * 1e3:.1f} ms "
            f"alone, {statistics.median(hot_loaded) * 1e3:.1f}/"
            f"{percentile(hot_loaded, 0.99) * 1e3:.1f} ms while the others load"
        )
        assert hot_statuses == {200}, hot.failures
        assert holdings.most <= BUDGET and len(held_at_end) <= BUDGET
        assert triton_model_name(HOT, "1") in held_at_end  # used all along: never the LRU
        # With two slots for the models in rotation, nearly every request is a cold start.
        assert len(every_cold) >= sent // 2
        assert percentile(every_cold, 0.99) < COLD_START_TIMEOUT_S / 2
        check_panels(Prometheus(stack), every_cold, cold_at, cold_by_model)
        check_metrics(Prometheus(stack), cold_by_model, waits, len(every_cold))
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
        check_a_version_out_of_triton_is_ready(stack, client, holdings)
    finally:
        client.close()
        triton.close()


def check_panels(
    prometheus: Prometheus,
    cold_s: list[float],
    cold_at: list[tuple[float, str]],
    cold_by_model: Counter[str],
) -> None:
    """The "Load on demand" panels right after the round-robin: every one has data, and
    it agrees with what the client saw. The cold starts of the panel's last 5 minutes
    per model lie between the client's of the last 4.5 (scrapes lag) and all it saw, a
    model's first cold start included (Ray's counter series begins with it)."""
    above_slowest = min(b for b in (*LOAD_BUCKETS_S, math.inf) if b >= max(cold_s))

    def recent(seconds: float) -> Counter[str]:
        since = time.monotonic() - seconds
        return Counter(name for at, name in cold_at if at >= since)

    deadline = time.monotonic() + 30
    while True:
        answers = {title: prometheus.query(expand(expr)) for title, expr in load_on_demand_panels()}
        counted = {
            r["metric"]["model"]: float(r["value"][1]) for r in answers["Cold starts, last 5 min"]
        }
        at_least = recent(270)
        seen = all(counted.get(model, 0) >= n for model, n in at_least.items())
        if (all(answers.values()) and seen) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert all(answers.values()), {title: bool(result) for title, result in answers.items()}
    values = {title: [float(r["value"][1]) for r in result] for title, result in answers.items()}
    (loaded,) = values["Loaded versions"]
    assert 1 <= loaded <= BUDGET
    short = {m: (counted.get(m, 0), n) for m, n in at_least.items() if counted.get(m, 0) < n}
    assert not short, f"panel's cold starts below the client's of the last 4.5 min: {short}"
    over = {m: (n, cold_by_model[m]) for m, n in counted.items() if n > cold_by_model[m]}
    assert not over, f"panel's cold starts above all the client saw: {over}"
    # A load takes no longer than the request that waited for it.
    quantiles = [v for v in values["Load on demand, p50 / p99"] if not math.isnan(v)]
    assert quantiles
    assert all(q <= above_slowest for q in quantiles), (quantiles, max(cold_s))
    assert {r["metric"]["reason"] for r in answers["Unloads per second"]} >= {"room"}


def check_metrics(
    prometheus: Prometheus, cold_by_model: Counter[str], waits: list[float], round_robin: int
) -> None:
    """The load-on-demand metrics in Prometheus count what the client saw: a cold start
    for each answer with ``x-cold-start``, a load time for each no longer than it waited,
    an unload for each cold start past the budget, the loaded versions within it."""
    expected = {model: float(n) for model, n in cold_by_model.items()}
    counted = prometheus.settled("model", "sum by (model) (infergate_cold_starts_total)", expected)
    assert counted == expected, "cold starts counted / cold answers seen"
    timed = prometheus.by("model", "sum by (model) (infergate_model_load_seconds_count)")
    assert timed == expected
    # Each load took no longer than the request waiting for it: at every bucket bound at
    # least as many loads as waits. (Buckets, not _sum: Ray exports a histogram's sum
    # from its buckets' midpoints.)
    buckets = prometheus.by("le", "sum by (le) (infergate_model_load_seconds_bucket)")
    assert len(buckets) == len(LOAD_BUCKETS_S) + 1, buckets
    slower = {le: n for le, n in buckets.items() if n < sum(w <= float(le) for w in waits)}
    assert not slower, (buckets, sorted(waits))
    unloads = sum(prometheus.by("", "sum(infergate_model_unloads_total)").values())
    assert unloads >= round_robin - BUDGET
    (most,) = prometheus.by("", "max(max_over_time(infergate_loaded_versions[30m]))").values()
    assert 1 <= most <= BUDGET
    print(
        f"Prometheus: {sum(counted.values()):.0f} cold starts over {len(counted)} models "
        f"({len(waits)} cold answers), {unloads:.0f} unloads, at most {most:.0f} versions "
        "loaded"
    )


def check_a_version_out_of_triton_is_ready(
    stack: Stack, client: httpx.Client, holdings: Holdings
) -> None:
    """Model readiness over REST and gRPC: a served version out of Triton is ready (its
    next request loads it), and asking does not load it."""
    out = sorted(name for name, loaded in listed(client).items() if not loaded)
    assert out, "every version is loaded: the budget did not hold"
    name = out[0]
    assert client.get(f"/v2/models/{name}/ready").status_code == 200
    grpc_url = f"127.0.0.1:{stack.env['INFERGATE_FRONTEND__GRPC_PORT']}"
    with triton_grpc.InferenceServerClient(url=grpc_url) as grpc_client:
        assert grpc_client.is_model_ready(name) and grpc_client.is_model_ready(HOT)
    assert triton_model_name(name, "1") not in holdings.held()
    assert listed(client)[name] is False


def test_idle_versions_are_unloaded_and_the_next_request_loads_them_again(stack: Stack) -> None:
    triton = TritonControl(f"127.0.0.1:{stack.env['INFERGATE_TRITON__GRPC_PORT']}")
    prometheus = Prometheus(stack)
    idle_unloads = 'sum(infergate_model_unloads_total{reason="idle"}) or vector(0)'
    try:
        holdings = Holdings(triton)
        going = len(holdings.held())
        (idle_before,) = prometheus.by("", idle_unloads).values()
        hot_cold_starts = f'sum by (model) (infergate_cold_starts_total{{model="{HOT}"}})'
        hot_before = prometheus.by("model", hot_cold_starts)
        wait_for(lambda: not holdings.held(), IDLE_UNLOAD_S + 30, "every idle version unloaded")
        with httpx.Client(base_url=stack.url, timeout=COLD_START_TIMEOUT_S + 30) as client:
            answer = client.post(f"/v1/models/{HOT}/predict", json={"inputs": ["hello"]})
            assert answer.status_code == 200 and float(answer.headers["x-cold-start"]) > 0
            assert holdings.held() == [triton_model_name(HOT, "1")]
        # Prometheus saw them go for idleness, and the hot model's cold start.
        wanted = {HOT: hot_before.get(HOT, 0) + 1}
        assert prometheus.settled("model", hot_cold_starts, wanted) == wanted
        (idle_after,) = prometheus.by("", idle_unloads).values()
        assert idle_after - idle_before >= going, (idle_before, idle_after, going)
    finally:
        triton.close()
