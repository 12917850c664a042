"""A rollout's report: its decision trail (each start, advance, promotion or rollback with
its reason and figures), kept as JSON in a tag on the canary's version when it ends."""

from __future__ import annotations

import json
from typing import Any

REPORT_TAG = "infergate.rollout_report"
REPORT_CHARS = 5000  # MLflow's limit on a tag's value


def report_text(trail: list[dict[str, Any]]) -> str:
    """The decision trail as JSON within ``REPORT_CHARS``: the earliest entries' figures
    are left out first, then the earliest entries (the end is what explains a rollback)."""
    trail = [dict(entry) for entry in trail]
    text = json.dumps(trail)
    for entry in trail[:-1]:
        if len(text) <= REPORT_CHARS:
            break
        entry.pop("figures", None)
        text = json.dumps(trail)
    while len(text) > REPORT_CHARS and len(trail) > 1:
        trail.pop(0)
        text = json.dumps(trail)
    return text[:REPORT_CHARS]
