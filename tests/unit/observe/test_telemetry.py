"""In-process metric totals: Prometheus histogram semantics, exact sums, every series a
replica sets declared once."""

import re
from dataclasses import replace

import numpy as np
import pytest
import yaml

from fakes import answered
from infergate.config import PROJECT_ROOT
from infergate.observe import metrics as m
from infergate.observe.backlog import MAX_REQUESTS
from infergate.observe.counters import ShadowCounters
from infergate.observe.telemetry import RayTelemetry, Totals, series_definitions
from infergate.serving.runtime import Prediction, Timings
from infergate.tasks import Figures


def by_name(totals: Totals) -> dict[tuple[str, tuple], float]:
    return {(name, tuple(sorted(tags.items()))): value for name, tags, value in totals.samples()}


def test_histogram_buckets_are_cumulative_with_le_inclusive_and_an_inf_bucket():
    totals = Totals()
    values = [0.0004, 0.001, 0.0012, 10.0]  # 0.001 sits on a bound: counted in le=0.001
    totals.observe(m.DURATION, ("m", "1", "total"), values)
    samples = by_name(totals)
    tags = (("model", "m"), ("stage", "total"), ("version", "1"))

    def bucket(le: str) -> float:
        return samples[("infergate_request_duration_seconds_bucket", (("le", le), *tags))]

    assert [bucket(le) for le in ("0.0005", "0.001", "0.0015", "0.002", "5.0", "+Inf")] == [
        1, 2, 3, 3, 3, 4,
    ]  # fmt: skip
    buckets = [k for k in samples if k[0].endswith("_bucket")]
    assert len(buckets) == len(m.LATENCY_BUCKETS_S) + 1
    assert samples[("infergate_request_duration_seconds_sum", tags)] == pytest.approx(sum(values))
    assert samples[("infergate_request_duration_seconds_count", tags)] == 4


def test_totals_keep_growing_and_label_sets_stay_apart():
    totals = Totals()
    totals.inc(m.REQUESTS, ("m", "1", "200"))
    totals.inc(m.REQUESTS, ("m", "1", "200"))
    totals.inc(m.REQUESTS, ("m", "1", "503"))
    totals.inc(m.TEXTS, ("m", "2"), 16)
    samples = by_name(totals)
    assert samples[("infergate_requests_total", (("model", "m"), ("status", "200"),
                                                 ("version", "1")))] == 2  # fmt: skip
    assert samples[("infergate_requests_total", (("model", "m"), ("status", "503"),
                                                 ("version", "1")))] == 1  # fmt: skip
    assert samples[("infergate_texts_total", (("model", "m"), ("version", "2")))] == 16


def prediction(raw: np.ndarray, labels: list[str]) -> Prediction:
    return answered(raw, labels, timings=Timings(0.001, 0.002, 0.0005), first_truncated=True)


class Gauge:
    """Stands in for a Ray gauge: remembers what was set last, per label set."""

    def __init__(self) -> None:
        self.values: dict[tuple, float] = {}

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.values[tuple(sorted(tags.items()))] = value


def test_a_request_records_every_frontend_metric_and_a_flush_sets_each_series():
    telemetry = RayTelemetry()
    gauges = {name: Gauge() for name in telemetry._gauges}
    telemetry._gauges = gauges
    telemetry.request("s", "1", 200, prediction(np.array([[0.2, 0.8], [0.9, 0.1]]),
                                                ["neg", "pos"]), 0.004)  # fmt: skip
    telemetry.request("e", "1", 200, prediction(np.ones((3, 8)), []), 0.003)
    ranked = replace(prediction(np.array([[0.9], [0.2]]), []), task="text-ranking")
    telemetry.request("r", "1", 200, ranked, 0.003)
    sparse = replace(prediction(np.array([[0.0, 1.2, 0.3]]), []), task="sparse-embedding")
    telemetry.request("p", "1", 200, sparse, 0.003)
    entities = Figures(np.array([2.0]), np.array([[1.0, 1.0]]), ("LOC", "PER"))
    tagged = replace(prediction(np.zeros((1, 4, 3)), ["O", "B-LOC", "B-PER"]),
                     task="token-classification", figures=entities)  # fmt: skip
    telemetry.request("n", "1", 200, tagged, 0.003)
    generated = np.array([[5, 6, 7], [8, -1, -1]])  # 4 tokens in a 0.002 s Triton call
    translated = replace(prediction(generated, []), task="translation")
    telemetry.request("t", "1", 200, translated, 0.003)
    telemetry.request("s", "1", 404, None, 0.001)
    telemetry.caller("search-team", "s", 429)
    assert not any(g.values for g in gauges.values())  # nothing reaches Ray before a flush
    telemetry.flush()

    declared = {name: set(labels) for name, _, labels in series_definitions()}
    samples = by_name(telemetry.totals)
    for (name, tags), value in samples.items():
        gauge = telemetry.gauge_of(name, dict(tags))
        assert {key for key, _ in tags} == declared[gauge], name
        assert gauges[gauge].values[tags] == value
    recorded = {name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
                for name, _ in samples}  # fmt: skip
    assert recorded == {metric.full_name for metric in m.FRONTEND} - {
        m.DRIFT.full_name,
        m.ROLLOUT_WEIGHT.full_name,
        *SHADOW_SERIES,  # set as they stand: test_a_canary_in_shadow_sets_its_series
        m.PAYLOAD_RECORDS.full_name,  # test_the_payload_logs_outcomes_set_their_series
    }
    t = (("model", "t"), ("version", "1"))
    assert samples[("infergate_output_tokens_sum", t)] == 4
    assert samples[("infergate_decoding_seconds_per_token_sum", t)] == pytest.approx(0.0005)
    assert samples[("infergate_decoding_seconds_per_token_count", t)] == 1
    assert samples[("infergate_predicted_class_total", (("class", "pos"), ("model", "s"),
                                                        ("version", "1")))] == 1  # fmt: skip
    assert samples[("infergate_requests_total", (("model", "s"), ("status", "404"),
                                                 ("version", "1")))] == 1  # fmt: skip
    assert samples[("infergate_truncated_texts_total", (("model", "e"), ("version", "1")))] == 1


def test_each_bucket_is_a_gauge_of_its_own_that_prometheus_names_back():
    # Ray's agent keeps 2,000 label sets per name. A bucket gauge still carries le, with
    # one value only, so le no longer multiplies a name's label sets.
    names = [name for name, _, _ in series_definitions()]
    assert len(names) == len(set(names))
    gauge_of = RayTelemetry().gauge_of
    series = "infergate_request_duration_seconds_bucket"
    assert gauge_of(series, {"le": "0.001"}) == f"{series}_01"
    assert gauge_of(series, {"le": "+Inf"}) == f"{series}_{len(m.DURATION.buckets):02d}"
    assert gauge_of("infergate_requests_total", {"model": "m"}) == "infergate_requests_total"
    # The scrape's rule (deployments/prometheus.yml) gives every bucket gauge its name back.
    config = yaml.safe_load((PROJECT_ROOT / "deployments" / "prometheus.yml").read_text())
    (ray,) = [job for job in config["scrape_configs"] if job["job_name"] == "ray"]
    rename = [r for r in ray["metric_relabel_configs"] if r.get("regex", "").endswith("[0-9]+")]
    (rule,) = rename
    for name in names:
        match = re.fullmatch(rule["regex"], name)
        series = name.rsplit("_", 1)[0]
        if series.endswith("_bucket"):
            assert match and rule["replacement"].replace("$1", match[1]) == series, name
        else:
            assert match is None, name


def test_the_control_planes_counter_is_never_a_replica_gauge():
    # A node's Ray metrics agent keeps the kind a name was registered with first: a
    # replica gauge of the same name would garble the control plane's counter.
    assert m.ROLLOUT_DECISIONS not in m.FRONTEND
    names = {name for name, _, _ in series_definitions()}
    assert m.ROLLOUT_DECISIONS.full_name not in names


def test_values_that_are_not_finite_are_left_out_of_histograms():
    totals = Totals()
    totals.observe(m.EMBEDDING_NORM, ("e", "1"), [1.5, float("nan"), float("inf"), 2.5])
    samples = by_name(totals)
    tags = (("model", "e"), ("version", "1"))
    assert samples[("infergate_embedding_norm_count", tags)] == 2
    assert samples[("infergate_embedding_norm_sum", tags)] == 4.0
    assert samples[("infergate_embedding_norm_bucket", (("le", "+Inf"), *tags))] == 2


SHADOW_SERIES = (m.SHADOW_TEXTS.full_name, m.SHADOW_DISAGREEMENT.full_name,
                 m.SHADOW_REQUESTS.full_name)  # fmt: skip


def test_a_canary_in_shadow_sets_its_series():
    telemetry = RayTelemetry()
    gauges = {name: Gauge() for name in telemetry._gauges}
    telemetry._gauges = gauges
    counters = ShadowCounters(requests=10, errors=2, texts=30, disagreement=4.5, slower=1,
                              dropped=3)  # fmt: skip
    telemetry.shadow("s", "2", counters)
    mv = (("model", "s"), ("version", "2"))
    assert gauges[m.SHADOW_TEXTS.full_name].values == {mv: 30}
    assert gauges[m.SHADOW_DISAGREEMENT.full_name].values == {mv: 4.5}
    outcomes = {dict(tags)["outcome"]: value
                for tags, value in gauges[m.SHADOW_REQUESTS.full_name].values.items()}  # fmt: skip
    assert outcomes == {"compared": 8, "failed": 2, "slower": 1, "dropped": 3}


def test_the_payload_logs_outcomes_set_their_series():
    telemetry = RayTelemetry()
    gauges = {name: Gauge() for name in telemetry._gauges}
    telemetry._gauges = gauges
    telemetry.payloads({"written": 40, "dropped": 4, "failed": 1})
    outcomes = {dict(tags)["outcome"]: value
                for tags, value in gauges[m.PAYLOAD_RECORDS.full_name].values.items()}  # fmt: skip
    assert outcomes == {"written": 40, "dropped": 4, "failed": 1}


def test_values_added_at_once_give_the_buckets_and_the_very_sum_of_one_by_one():
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.exponential(0.01, 500), [np.nan, np.inf, 0.001, 0.0]])
    each, at_once = Totals(), Totals()
    for value in values.tolist():
        each.observe(m.DURATION, ("m", "1", "total"), (value,))
    at_once.observe_many(m.DURATION, ("m", "1", "total"), values[:200])
    at_once.observe_many(m.DURATION, ("m", "1", "total"), values[200:])
    assert by_name(at_once) == by_name(each)  # == on the sums: not approx


def test_requests_wait_until_the_totals_are_read_or_too_many_wait():
    telemetry = RayTelemetry()
    requests = [
        prediction(np.array([[0.2, 0.8], [0.9, 0.1]]), ["neg", "pos"]),
        replace(prediction(np.array([[0.3, 0.7]]), ["neg", "pos"]), timings=Timings(0.1, 0.2)),
    ]
    each = RayTelemetry()
    for i in range(40):
        telemetry.request("s", "1", 200 if i % 5 else 503, requests[i % 2], 0.001 * i)
        each.request("s", "1", 200 if i % 5 else 503, requests[i % 2], 0.001 * i)
        each.flush()  # a read: nothing waits after it
    assert len(telemetry._backlog) == 40
    assert by_name(telemetry.totals) == by_name(each.totals)
    assert not len(telemetry._backlog)
    for _ in range(MAX_REQUESTS):
        telemetry.request("s", "1", 200, requests[0], 0.001)
    assert not len(telemetry._backlog)
