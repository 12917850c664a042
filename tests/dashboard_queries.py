"""The dashboards as the tests read them: every panel, every PromQL expression."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from infergate.config import PROJECT_ROOT
from infergate.dashboards.generate import render_all

DASHBOARDS = {name: json.loads(text) for name, text in render_all().items()}
GRAFANA = PROJECT_ROOT / "deployments" / "grafana" / "provisioning"


def panels() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, dashboard in DASHBOARDS.items():
        for panel in dashboard["panels"]:
            if panel["type"] != "row":
                yield name, panel


def expressions() -> Iterator[str]:
    for _, panel in panels():
        for target in panel["targets"]:
            yield target["expr"]


def variable_selectors() -> Iterator[str]:
    """The series selectors inside the label_values(...) variable queries."""
    for dashboard in DASHBOARDS.values():
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                match = re.fullmatch(r"label_values\((.+), *(\w+)\)", variable["definition"])
                assert match, variable["definition"]
                yield match.group(1)
