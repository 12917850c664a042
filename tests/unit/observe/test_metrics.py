import re

from infergate.observe import metrics as m


def test_names_are_prefixed_unique_and_prometheus_safe():
    names = [metric.full_name for metric in m.ALL]
    assert len(names) == len(set(names))
    for name in names:
        assert re.fullmatch(r"infergate_[a-z_]+", name), name


def test_histograms_have_positive_increasing_buckets():
    # Ray's metrics API refuses non-positive boundaries; Prometheus needs them increasing.
    for metric in m.ALL:
        if metric.kind == "histogram":
            assert metric.buckets, metric.name
            assert all(b > 0 for b in metric.buckets), metric.name
            assert list(metric.buckets) == sorted(set(metric.buckets)), metric.name
        else:
            assert not metric.buckets


def test_latency_buckets_are_fine_between_1ms_and_1s():
    inside = [b for b in m.LATENCY_BUCKETS_S if 0.001 <= b <= 1.0]
    assert len(inside) >= 15


def test_counters_end_in_total_and_labels_are_bounded():
    # entity: the entity types of a token classifier, as bounded as its labels; outcome
    # and test: the shadow stage's four outcomes and two tests; reason: why a version was
    # unloaded (room or idle).
    allowed = {"model", "version", "stage", "status", "class", "feature", "method", "role",
               "decision", "key", "entity", "outcome", "test", "reason"}  # fmt: skip
    for metric in m.ALL:
        assert (metric.kind == "counter") == metric.full_name.endswith("_total")
        assert set(metric.labels) <= allowed
