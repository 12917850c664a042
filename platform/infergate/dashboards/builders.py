"""Small typed builders for Grafana dashboards: frozen dataclasses that render to
Grafana's dashboard JSON model (schema version 39, Grafana 10.x/11.x).

Only what our dashboards use is modelled: time series, heatmap and stat panels over
Prometheus queries, rows, and template variables. Every query goes to the data source
chosen by the ``datasource`` variable, so one file works against any Prometheus.
Reference: https://grafana.com/docs/grafana/latest/dashboards/build-dashboards/view-dashboard-json-model/
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

SCHEMA_VERSION = 39
GRID_WIDTH = 24  # Grafana's grid is 24 columns wide

# The data source the dashboards default to; provisioning and `push` create it with
# this uid, so the dashboards work with no click after either.
DATASOURCE_UID = "infergate-prometheus"
DATASOURCE_NAME = "Prometheus (infergate)"
DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}
FOLDER_UID = "infergate"
FOLDER_TITLE = "infergate"
TAG = "infergate"

PanelKind = Literal["timeseries", "heatmap", "stat"]
Stacking = Literal["none", "normal", "percent"]


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel. ``legend`` uses Grafana's ``{{label}}`` syntax."""

    expr: str
    legend: str = ""

    def to_json(self, ref_id: str, *, heatmap: bool = False) -> dict[str, Any]:
        return {
            "datasource": DATASOURCE_REF,
            "editorMode": "code",
            "expr": self.expr,
            # Heatmaps read the buckets as they are: one series per `le`, sorted by it.
            "format": "heatmap" if heatmap else "time_series",
            "legendFormat": "{{le}}" if heatmap else (self.legend or "__auto"),
            "range": True,
            "refId": ref_id,
        }


@dataclass(frozen=True)
class Threshold:
    """A horizontal line (and colour step) at ``value``."""

    value: float
    color: str


@dataclass(frozen=True)
class Panel:
    """A panel. ``unit`` is a Grafana unit id (``s``, ``percentunit``, ``reqps`` ...)."""

    title: str
    queries: tuple[Query, ...]
    kind: PanelKind = "timeseries"
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8
    thresholds: tuple[Threshold, ...] = ()
    base_color: str = "green"  # below the first threshold
    stacking: Stacking = "none"
    bars: bool = False
    min_value: float | None = None
    max_value: float | None = None

    def __post_init__(self) -> None:
        if not self.queries:
            raise ValueError(f"panel {self.title!r} has no query")
        if not 1 <= self.width <= GRID_WIDTH:
            raise ValueError(f"panel {self.title!r}: width must be 1..{GRID_WIDTH}")

    def to_json(self, panel_id: int, x: int, y: int) -> dict[str, Any]:
        heatmap = self.kind == "heatmap"
        targets = [
            query.to_json(chr(ord("A") + i), heatmap=heatmap)
            for i, query in enumerate(self.queries)
        ]
        panel: dict[str, Any] = {
            "id": panel_id,
            "type": self.kind,
            "title": self.title,
            "description": self.description,
            "datasource": DATASOURCE_REF,
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "targets": targets,
        }
        if heatmap:
            panel["fieldConfig"] = {"defaults": {}, "overrides": []}
            panel["options"] = _heatmap_options(self.unit)
        else:
            panel["fieldConfig"] = {"defaults": self._field_defaults(), "overrides": []}
            panel["options"] = _stat_options() if self.kind == "stat" else _timeseries_options()
        return panel

    def _field_defaults(self) -> dict[str, Any]:
        steps: list[dict[str, Any]] = [{"color": self.base_color, "value": None}]
        steps += [{"color": t.color, "value": t.value} for t in self.thresholds]
        defaults: dict[str, Any] = {
            "unit": self.unit,
            "color": {"mode": "thresholds" if self.kind == "stat" else "palette-classic"},
            "thresholds": {"mode": "absolute", "steps": steps},
        }
        if self.min_value is not None:
            defaults["min"] = self.min_value
        if self.max_value is not None:
            defaults["max"] = self.max_value
        if self.kind == "timeseries":
            stacked = self.stacking != "none"
            defaults["custom"] = {
                "drawStyle": "bars" if self.bars else "line",
                "lineWidth": 1,
                "fillOpacity": 60 if stacked or self.bars else 10,
                "showPoints": "never",
                "spanNulls": False,
                "stacking": {"mode": self.stacking, "group": "A"},
                "thresholdsStyle": {"mode": "dashed" if self.thresholds else "off"},
            }
        return defaults


def _timeseries_options() -> dict[str, Any]:
    return {
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }


def _stat_options() -> dict[str, Any]:
    return {
        "colorMode": "value",
        "graphMode": "area",
        "justifyMode": "auto",
        "orientation": "auto",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "textMode": "auto",
    }


def _heatmap_options(unit: str) -> dict[str, Any]:
    return {
        "calculate": False,  # Prometheus buckets are already a histogram
        "cellGap": 1,
        "color": {
            "exponent": 0.5,
            "fill": "dark-orange",
            "mode": "scheme",
            "scale": "exponential",
            "scheme": "Oranges",
            "steps": 64,
        },
        "filterValues": {"le": 1e-9},  # hide empty cells
        "legend": {"show": True},
        "rowsFrame": {"layout": "le"},  # the `le` label is each row's upper bound
        "showValue": "never",
        "tooltip": {"mode": "single", "yHistogram": True},
        "yAxis": {"axisPlacement": "left", "unit": unit},
    }


@dataclass(frozen=True)
class Row:
    """A titled row of panels, laid out left to right and wrapped at the grid width."""

    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    """A query variable filled with ``label_values(...)`` from the data source."""

    name: str
    label: str
    query: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "type": "query",
            "datasource": DATASOURCE_REF,
            "definition": self.query,
            "query": {"query": self.query, "refId": f"{self.name}-values"},
            "refresh": 2,  # on time range change: new versions show up
            "includeAll": True,
            "multi": True,
            # `.*` rather than a list of the values known at load time, so "All" also
            # covers a version that appears while the dashboard is open.
            "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "options": [],
            "regex": "",
            "sort": 1,
            "hide": 0,
        }


def datasource_variable() -> dict[str, Any]:
    """The ``datasource`` variable: any Prometheus data source, ours by default."""
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {"selected": False, "text": DATASOURCE_NAME, "value": DATASOURCE_UID},
        "options": [],
        "refresh": 1,
        "regex": "",
        "includeAll": False,
        "multi": False,
        "hide": 0,
    }


@dataclass(frozen=True)
class Dashboard:
    """A dashboard: rows of panels under the ``datasource`` variable and ``variables``."""

    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    variables: tuple[Variable, ...] = ()
    refresh: str = "10s"
    time_from: str = "now-1h"

    def panels(self) -> Iterator[Panel]:
        for row in self.rows:
            yield from row.panels

    def to_json(self) -> dict[str, Any]:
        panels: list[dict[str, Any]] = []
        next_id, y = 1, 0
        for row in self.rows:
            panels.append(
                {
                    "id": next_id,
                    "type": "row",
                    "title": row.title,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                    "panels": [],
                }
            )
            next_id, y = next_id + 1, y + 1
            x, line_height = 0, 0
            for panel in row.panels:
                if x + panel.width > GRID_WIDTH:
                    x, y, line_height = 0, y + line_height, 0
                panels.append(panel.to_json(next_id, x, y))
                next_id, x = next_id + 1, x + panel.width
                line_height = max(line_height, panel.height)
            y += line_height
        return {
            "id": None,  # Grafana matches on uid; an id would pin one Grafana instance
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": [TAG],
            "timezone": "browser",
            "editable": True,
            "graphTooltip": 1,  # shared crosshair
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "refresh": self.refresh,
            "time": {"from": self.time_from, "to": "now"},
            "timepicker": {},
            "fiscalYearStartMonth": 0,
            "liveNow": False,
            "weekStart": "",
            "annotations": {"list": [_builtin_annotations()]},
            "links": [
                {
                    "title": "infergate dashboards",
                    "type": "dashboards",
                    "tags": [TAG],
                    "asDropdown": True,
                    "includeVars": True,
                    "keepTime": True,
                    "icon": "external link",
                    "targetBlank": False,
                    "tooltip": "",
                    "url": "",
                }
            ],
            "templating": {"list": [datasource_variable(), *(v.to_json() for v in self.variables)]},
            "panels": panels,
        }


def _builtin_annotations() -> dict[str, Any]:
    return {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
