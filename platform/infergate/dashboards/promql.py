"""PromQL the dashboards are built from, and the metrics of other components they read.

Our own names come from :mod:`infergate.observe.metrics`; the helpers below only assemble
expressions, so a renamed metric there renames it everywhere here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from infergate.observe import metrics as m

RATE = "$__rate_interval"  # Grafana: at least four scrape intervals, safe for rate()
MODEL_VERSION = ('model=~"$model"', 'version=~"$version"')
# Triton names one model per served version `<model>__v<version>`
# (infergate.triton.repository.triton_model_name); names with unsafe characters get a
# hash suffix there and will not match this filter.
TRITON_MODEL = ('model=~"${model}__v${version}"',)
SERVE_APP = ('application="infergate"',)  # infergate.serve_app.APP_NAME

# Metrics of other components the dashboards and alerts read, by exporter.
EXTERNAL_METRICS: Mapping[str, frozenset[str]] = {
    # https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/metrics.html
    "triton": frozenset(
        {
            "nv_inference_request_success",
            "nv_inference_request_failure",
            "nv_inference_count",
            "nv_inference_exec_count",
            "nv_inference_queue_duration_us",
            "nv_inference_compute_input_duration_us",
            "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us",
            "nv_inference_pending_request_count",
        }
    ),
    # Ray Serve's own metrics (ray/serve/_private), exported with the `ray_` prefix.
    "ray": frozenset(
        {
            "ray_serve_deployment_replica_healthy",
            "ray_serve_autoscaling_target_replicas",
            "ray_serve_replica_processing_queries",
        }
    ),
    # HAProxy's built-in Prometheus exporter (the ingress Ray Serve starts).
    # https://www.haproxy.com/documentation/haproxy-configuration-manual/latest/#prometheus-exporter
    "haproxy": frozenset(
        {
            "haproxy_frontend_http_requests_total",
            "haproxy_frontend_http_responses_total",
            "haproxy_frontend_current_sessions",
        }
    ),
    # Prometheus itself: 1 when the last scrape of a target worked.
    "prometheus": frozenset({"up"}),
}


def selector(metric: str, *matchers: str) -> str:
    """``metric{matcher, ...}``; always with braces, so metric names are easy to find."""
    return f"{metric}{{{', '.join(matchers)}}}"


def rate(metric: str, *matchers: str, window: str = RATE) -> str:
    return f"rate({selector(metric, *matchers)}[{window}])"


def increase_seen(metric: str, *matchers: str, window: str = "5m") -> str:
    """A counter's increase over ``window``, a series' first increment counted.

    Ray creates a series at its first increment, so ``increase()`` and ``rate()``, which
    need two samples, never see it: a model loaded once shows no load. Here a series
    older than the window gives its growth since then, and one born inside it (or reset
    in it) its whole value, which all happened inside the window.
    """
    series = selector(metric, *matchers)
    return f"(({series} - {series} offset {window}) >= 0 or {series})"


def sum_by(labels: str, expr: str) -> str:
    return f"sum by ({labels}) ({expr})"


def ratio(numerator: str, denominator: str) -> str:
    return f"{numerator}\n  / {denominator}"


def quantile(q: float, histogram: m.Metric, by: str = "model, version", *matchers: str) -> str:
    """The ``q`` quantile from a histogram's buckets, summed over replicas first."""
    if histogram.kind != "histogram":
        raise ValueError(f"{histogram.full_name} is a {histogram.kind}, not a histogram")
    buckets = rate(histogram.full_name + "_bucket", *matchers)
    return f"histogram_quantile({q}, sum by (le, {by}) ({buckets}))"


def recent_quantile(q: float, histogram: m.Metric, by: str, window: str = "5m") -> str:
    """The ``q`` quantile of the observations of the last ``window``, each series' first
    ones counted (:func:`increase_seen`): for rare events such as loads."""
    if histogram.kind != "histogram":
        raise ValueError(f"{histogram.full_name} is a {histogram.kind}, not a histogram")
    buckets = increase_seen(histogram.full_name + "_bucket", window=window)
    return f"histogram_quantile({q}, sum by (le, {by}) ({buckets}))"


def heatmap(histogram: m.Metric, *matchers: str) -> str:
    """Observations per second in each bucket, one series per ``le``."""
    return sum_by("le", rate(histogram.full_name + "_bucket", *matchers))


def mean(histogram: m.Metric, by: str = "model, version", *matchers: str) -> str:
    """The mean observation: rate of the sum over rate of the count."""
    return ratio(
        sum_by(by, rate(histogram.full_name + "_sum", *matchers)),
        sum_by(by, rate(histogram.full_name + "_count", *matchers)),
    )


_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def expand(
    expr: str,
    *,
    rate_interval: str = "1m",
    values: Mapping[str, str] | None = None,
) -> str:
    """The expression with Grafana's variables replaced, for running it outside Grafana.

    ``$model``/``$version`` (and ``${...}``) default to ``.*`` (what "All" sends);
    ``$__rate_interval`` becomes ``rate_interval``. An unknown variable raises KeyError.
    """
    replacements = {"model": ".*", "version": ".*", **(values or {})}
    replacements["__rate_interval"] = rate_interval

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in replacements:
            raise KeyError(f"no value for the Grafana variable ${name} in {expr!r}")
        return replacements[name]

    return _VARIABLE.sub(replace, expr)


def known_metric_names() -> frozenset[str]:
    """Every series name a query may select: ours (histograms with their ``_bucket``,
    ``_sum`` and ``_count`` series) and the exporters' of :data:`EXTERNAL_METRICS`."""
    ours = set()
    for metric in m.ALL:
        if metric.kind == "histogram":
            ours |= {metric.full_name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            ours.add(metric.full_name)
    return frozenset(ours.union(*EXTERNAL_METRICS.values()))
