"""The Backend dashboard: Triton, Ray Serve and the HAProxy ingress, from their own
metrics (names in :data:`infergate.dashboards.promql.EXTERNAL_METRICS`)."""

from __future__ import annotations

from infergate.dashboards.builders import Dashboard, Panel, Query, Row, Threshold, Variable
from infergate.dashboards.promql import (
    SERVE_APP,
    TRITON_MODEL,
    increase_seen,
    rate,
    ratio,
    recent_quantile,
    selector,
    sum_by,
)
from infergate.observe import metrics as m

HTTP_FRONTEND = ('proxy="http_frontend"',)  # the HAProxy frontend Ray Serve configures


def _per_model(expr: str, legend: str = "") -> Query:
    """Summed per Triton model (one per served version)."""
    return Query(sum_by("model", expr), "{{model}}" + (f" {legend}" if legend else ""))


def _per_request(metric: str) -> str:
    """A cumulative Triton duration counter divided by the requests it covers."""
    return ratio(
        sum_by("model", rate(metric, *TRITON_MODEL)),
        sum_by("model", rate("nv_inference_request_success", *TRITON_MODEL)),
    )


def _serve(metric: str, by: str, legend: str) -> Query:
    return Query(sum_by(by, selector(metric, *SERVE_APP)), legend)


def _triton() -> Row:
    return Row(
        "Triton",
        (
            Panel(
                "Queue time per request",
                (Query(_per_request("nv_inference_queue_duration_us"), "{{model}}"),),
                unit="µs",
                width=8,
                description="Time waiting for the dynamic batcher and a model instance.",
            ),
            Panel(
                "Compute time per request",
                tuple(
                    Query(
                        _per_request(f"nv_inference_compute_{part}_duration_us"),
                        "{{model}} " + part,
                    )
                    for part in ("input", "infer", "output")
                ),
                unit="µs",
                width=8,
                description="Input copy, model execution, output copy.",
            ),
            Panel(
                "Batch size (inferences per execution)",
                (
                    Query(
                        ratio(
                            sum_by("model", rate("nv_inference_count", *TRITON_MODEL)),
                            sum_by("model", rate("nv_inference_exec_count", *TRITON_MODEL)),
                        ),
                        "{{model}}",
                    ),
                ),
                width=8,
                description="How well the dynamic batcher batches: 1 means no batching.",
            ),
            Panel(
                "Triton requests per second",
                (
                    _per_model(rate("nv_inference_request_success", *TRITON_MODEL), "success"),
                    _per_model(rate("nv_inference_request_failure", *TRITON_MODEL), "failure"),
                ),
                unit="reqps",
            ),
            Panel(
                "Pending requests",
                (_per_model(selector("nv_inference_pending_request_count", *TRITON_MODEL)),),
                description="Requests received and not yet executing: queueing in Triton.",
            ),
        ),
    )


def _load_on_demand() -> Row:
    """Versions loaded in Triton under a budget (docs/many-models.md); empty without one."""
    return Row(
        "Load on demand",
        (
            Panel(
                "Loaded versions",
                (Query(f"max({selector(m.LOADED_VERSIONS.full_name)})", "loaded"),),
                width=6,
                description="Served versions loaded in the fullest Triton now; at most "
                "triton.max_loaded_versions.",
            ),
            Panel(
                "Cold starts, last 5 min",
                (Query(sum_by("model", increase_seen(m.COLD_STARTS.full_name)), "{{model}}"),),
                width=6,
                description="Loads of a version a request asked for, in the 5 minutes "
                "before each point; a version's first counted too (docs/many-models.md).",
            ),
            Panel(
                "Load on demand, p50 / p99",
                (
                    Query(recent_quantile(0.5, m.LOAD_DURATION, "model"), "{{model}} p50"),
                    Query(recent_quantile(0.99, m.LOAD_DURATION, "model"), "{{model}} p99"),
                ),
                unit="s",
                width=6,
                description="Seconds from a request's demand to the version ready, making "
                "room included, over the loads of the 5 minutes before each point.",
            ),
            Panel(
                "Unloads per second",
                (Query(sum_by("reason", rate(m.EVICTIONS.full_name)), "{{reason}}"),),
                unit="reqps",
                width=6,
                description="room: the least recently used, for a version asked for; idle: "
                "after triton.idle_unload_s.",
            ),
        ),
    )


def _ray_serve() -> Row:
    return Row(
        "Ray Serve",
        (
            Panel(
                "Replicas",
                (
                    _serve(
                        "ray_serve_deployment_replica_healthy",
                        "deployment",
                        "{{deployment}} healthy",
                    ),
                    _serve(
                        "ray_serve_autoscaling_target_replicas",
                        "deployment",
                        "{{deployment}} target",
                    ),
                ),
                min_value=0,
            ),
            Panel(
                "Ongoing requests per replica",
                (_serve("ray_serve_replica_processing_queries", "replica", "{{replica}}"),),
                min_value=0,
                description="What Ray Serve autoscaling compares with target_ongoing_requests.",
            ),
        ),
    )


def _ingress() -> Row:
    return Row(
        "Ingress (HAProxy)",
        (
            Panel(
                "Responses per second by code",
                (
                    Query(
                        sum_by(
                            "code", rate("haproxy_frontend_http_responses_total", *HTTP_FRONTEND)
                        ),
                        "{{code}}",
                    ),
                ),
                unit="reqps",
                stacking="normal",
                width=8,
            ),
            Panel(
                "HTTP requests per second",
                (
                    Query(
                        f"sum({rate('haproxy_frontend_http_requests_total', *HTTP_FRONTEND)})",
                        "requests",
                    ),
                ),
                unit="reqps",
                width=8,
            ),
            Panel(
                "Open connections",
                (
                    Query(
                        f"sum({selector('haproxy_frontend_current_sessions', *HTTP_FRONTEND)})",
                        "sessions",
                    ),
                ),
                width=8,
            ),
            Panel(
                "Scrape targets up",
                (Query(selector("up", 'job=~"triton|ray|ingress"'), "{{job}}"),),
                kind="stat",
                width=24,
                height=4,
                thresholds=(Threshold(1, "green"),),
                base_color="red",
                description="1: Prometheus reaches the component's metrics endpoint.",
            ),
        ),
    )


def backend(variables: tuple[Variable, ...]) -> Dashboard:
    """Triton queue and compute time, batching, Ray Serve replicas, the ingress."""
    return Dashboard(
        "infergate-backend",
        "infergate / Backend",
        "Triton queue and compute time per request, batch sizes, Ray Serve replicas and "
        "ongoing requests, HAProxy ingress.",
        (_triton(), _load_on_demand(), _ray_serve(), _ingress()),
        variables,
    )
