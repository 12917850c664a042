"""Markdown figures and tables for the bench's reports."""

from __future__ import annotations

import math
from collections.abc import Iterable


def num(value: float | None, digits: int = 1) -> str:
    """``value`` with thousands separators and ``digits`` decimals; "-" for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    """A markdown table's lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines
