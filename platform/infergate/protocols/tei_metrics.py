"""One served model's metrics in Prometheus's text format, for TEI's ``GET /metrics``
under the model's base URL (``/tei/{model}/metrics``).

TEI serves one model per server, so its ``/metrics`` is that model's. Here a model is
answered by every front-end replica, each recording its own counts, so no replica alone
holds the model's figures: they are read from the platform's Prometheus, whose
``/federate`` endpoint gives the newest sample of every series matched, as scraped from
all replicas (https://prometheus.io/docs/prometheus/latest/federation/). The figures are
as old as Prometheus's last scrape (5 s on the local stack).
"""

from __future__ import annotations

import httpx

from infergate.errors import BackendUnavailable, RouteNotFound
from infergate.observe.metrics import PREFIX

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus's text format


def selector(model: str) -> str:
    """The series of ``model`` among infergate's metrics, as a Prometheus selector."""
    escaped = model.replace("\\", "\\\\").replace('"', '\\"')
    return f'{{__name__=~"{PREFIX}.+",model="{escaped}"}}'


async def model_metrics(
    federate_url: str | None,
    model: str,
    timeout_s: float,
    transport: httpx.AsyncBaseTransport | None = None,
) -> str:
    """The newest samples of ``model``'s series, in Prometheus's text format
    (``transport``: how to reach Prometheus, httpx's own by default)."""
    if federate_url is None:
        raise RouteNotFound(
            "this front-end reads no metrics to answer /metrics: frontend.metrics_federate_url "
            "is unset; scrape the replicas' metrics through Prometheus (docs/monitoring.md)"
        )
    try:
        async with httpx.AsyncClient(timeout=timeout_s, transport=transport) as client:
            reply = await client.get(federate_url, params={"match[]": selector(model)})
    except httpx.HTTPError:
        raise BackendUnavailable(
            "the platform's Prometheus did not answer; retry shortly"
        ) from None
    if reply.status_code != 200:
        raise BackendUnavailable(f"the platform's Prometheus answered {reply.status_code}")
    return reply.text
