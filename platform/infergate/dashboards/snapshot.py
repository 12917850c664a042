"""Render the key dashboard panels to PNG straight from Prometheus, without Grafana.

For people without a Grafana and for CI artefacts. The panels are the dashboards' own
(:data:`infergate.dashboards.boards.KEY_PANELS`): same queries, same thresholds, with
the Grafana variables set to "All".
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from infergate.dashboards.boards import KEY_PANELS
from infergate.dashboards.builders import Panel
from infergate.dashboards.promql import expand
from infergate.errors import DashboardError

POINTS = 240  # samples per series: smooth lines, small responses
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def snapshot(
    prometheus_url: str,
    out_dir: Path,
    *,
    minutes: int = 15,
    panels: Sequence[Panel] = KEY_PANELS,
    clock: Callable[[], float] = time.time,
    timeout_s: float = 10.0,
) -> list[Path]:
    """One PNG per panel in ``out_dir`` covering the last ``minutes``; returns the files.

    Raises :class:`DashboardError` when Prometheus cannot be reached or rejects a query.
    A panel without data still gets a PNG that says so.
    """
    if minutes < 1:
        raise DashboardError(f"--minutes must be at least 1, got {minutes}")
    end = clock()
    start = end - minutes * 60
    step_s = max(1.0, minutes * 60 / POINTS)
    # Like Grafana's $__rate_interval: several scrapes (5 s) and at least a few steps.
    rate_interval = f"{max(30, round(4 * step_s))}s"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with httpx.Client(base_url=prometheus_url.rstrip("/"), timeout=timeout_s) as client:
        for panel in panels:
            series = []
            for query in panel.queries:
                expr = expand(query.expr, rate_interval=rate_interval)
                for result in _query_range(client, prometheus_url, expr, start, end, step_s):
                    series.append((_legend(query.legend, result["metric"]), result["values"]))
            path = out_dir / f"{_slug(panel.title)}.png"
            _render(panel, series, path, minutes)
            written.append(path)
    return written


def _query_range(
    client: httpx.Client, url: str, expr: str, start: float, end: float, step_s: float
) -> list[dict[str, Any]]:
    try:
        response = client.post(
            "/api/v1/query_range",
            data={"query": expr, "start": start, "end": end, "step": step_s},
        )
    except httpx.HTTPError as error:
        raise DashboardError(
            f"cannot reach Prometheus at {url}: {error}; is it running (`infergate up`), "
            "or pass --prometheus-url"
        ) from error
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code != 200 or body.get("status") != "success":
        detail = body.get("error") or response.text[:200]
        raise DashboardError(f"Prometheus at {url} rejected the query {expr!r}: {detail}")
    return list(body["data"]["result"])


def _legend(template: str, labels: dict[str, str]) -> str:
    if not template:
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
    return _LEGEND_LABEL.sub(lambda match: labels.get(match.group(1), ""), template).strip()


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _render(
    panel: Panel, series: list[tuple[str, list[list[Any]]]], path: Path, minutes: int
) -> None:
    # A Figure without pyplot: no global state, the Agg canvas, safe in threads and CI.
    figure = Figure(figsize=(10, 4.2), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    scale, unit_label = _unit(panel.unit)
    for label, values in sorted(series, key=lambda item: item[0]):
        times = [datetime.fromtimestamp(float(t)) for t, _ in values]
        numbers = [float(v) * scale for _, v in values]
        # matplotlib's units registry takes datetimes; its stubs name only numbers and arrays
        axes.plot(times, numbers, label=label, linewidth=1.4)  # type: ignore[arg-type]
    _draw_thresholds(axes, panel, scale)
    if not series:
        axes.text(0.5, 0.5, "no data", transform=axes.transAxes, ha="center", va="center",
                  fontsize=14, color="grey")  # fmt: skip
    if panel.unit == "percentunit":
        axes.yaxis.set_major_formatter(PercentFormatter(1.0))
    if panel.min_value is not None:
        axes.set_ylim(bottom=panel.min_value * scale)
    locator = AutoDateLocator()
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    axes.set_title(f"{panel.title} (last {minutes} min)", loc="left", fontsize=12)
    axes.set_ylabel(unit_label)
    axes.grid(True, alpha=0.3)
    if series or panel.thresholds:
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    figure.savefig(path, format="png")


_COLORS = {"green": "tab:green", "orange": "darkorange", "red": "firebrick"}


def _draw_thresholds(axes: Any, panel: Panel, scale: float) -> None:
    """Dashed lines with the band above each shaded, like Grafana's "line+area" style,
    so thresholds do not read as data lines of the same colour."""
    if not panel.thresholds:
        return
    values = [t.value * scale for t in panel.thresholds]
    top = max(axes.get_ylim()[1], max(values) * 1.15)
    for threshold, low, high in zip(panel.thresholds, values, [*values[1:], top], strict=True):
        color = _COLORS.get(threshold.color, threshold.color)
        axes.axhspan(low, high, color=color, alpha=0.06, linewidth=0)
        axes.axhline(
            low, color=color, linestyle="--", linewidth=1, label=f"threshold {low:g}"
        )  # in the axis' unit, like the data
    axes.set_ylim(top=top)


def _unit(unit: str) -> tuple[float, str]:
    """How to scale values for display, and the axis label."""
    return {
        "s": (1000.0, "milliseconds"),
        "reqps": (1.0, "requests / s"),
        "percentunit": (1.0, "share"),
    }.get(unit, (1.0, ""))
