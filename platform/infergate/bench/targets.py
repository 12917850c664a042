"""The targets of a benchmark run (from issue #5), checked against its results document
(see :mod:`infergate.bench.analysis`).

Each target is a row with pass/fail, never dropped when it cannot be computed (it then
says what is missing):

- single text, c=32: infergate req/s >= 0.55 x the ceiling's best seq/s (any batch);
- 16 texts, c=32: infergate seq/s >= 0.85 x the ceiling's best seq/s;
- every c=32 cell: infergate >= 5 x naive (the better of its fp32 and int8 servers in
  that cell) and >= 1.5 x ensemble (requests/s);
- single text, c=1: infergate p50 <= ceiling batch-1 p50 + 1.5 ms, and p99 <= 2 x p50.

Each is checked at every token length measured; a cell with errors fails. A missed c=1
target whose requirement lies below what Triton alone and the floor take together (see
:func:`~infergate.bench.analysis.latency_budget`) says so in its note; a missed
single-text share says what the front-end's own work costs per request and how much the
target's rate leaves for it (see :func:`~infergate.bench.analysis.cpu_budget`); a missed
share of the ceiling also says what the lean front-end on the same stack reached
(``infergate.bench.lean``), when it ran, and so does a missed c=1 median.
"""

from __future__ import annotations

import math
from typing import Any

from infergate.bench.analysis import (
    ENSEMBLE_FACTOR,
    MULTI_TEXT_SHARE,
    NAIVE_FACTOR,
    P99_OVER_P50,
    SINGLE_TEXT_SHARE,
    best_ceiling_row,
    ceiling_row,
    cell_row,
    cpu_budget,
    latency_budget,
    latency_requirement,
    measured_tokens,
)

# A missed c=1 target is called out of reach of the layout only when the sum of the two
# medians below which no front-end can answer (see latency_budget) exceeds the requirement
# by more than this much of it: one run's medians are estimates, not strict bounds.
BOUND_MARGIN = 1.1


def check(
    target: str,
    cell: str,
    value: float | None,
    required: float | None,
    *,
    at_least: bool,
    unit: str,
    missing: str = "",
    errors: int = 0,
) -> dict[str, Any]:
    """One target row. ``at_least``: value >= required passes, else value <= required.

    ``shortfall`` is how far a miss is from the requirement, as a fraction of it.
    """
    row: dict[str, Any] = {
        "target": target,
        "cell": cell,
        "value": value,
        "required": required,
        "comparison": ">=" if at_least else "<=",
        "unit": unit,
        "passed": None,
        "shortfall": None,
        "note": missing,
    }
    if value is None or required is None or math.isnan(value) or math.isnan(required):
        row["note"] = missing or "not measured"
        return row
    passed = value >= required if at_least else value <= required
    if errors:
        passed, row["note"] = False, f"{errors} failed requests in the cell"
    row["passed"] = passed
    gap = (required - value) if at_least else (value - required)
    if not passed and required and gap > 0:  # not when only the errors failed it
        row["shortfall"] = gap / abs(required)
    return row


def _errors(*rows: dict[str, Any] | None) -> int:
    return sum(int(row.get("errors", 0)) for row in rows if row)


def _missing(**parts: Any) -> str:
    absent = [name for name, value in parts.items() if value is None]
    return "not measured: " + ", ".join(absent) if absent else ""


NAIVE = ("naive", "naive-int8")  # each baseline's best honest setting: whichever was faster


def _best_of(
    results: dict[str, Any], scenarios: tuple[str, ...], texts: int, tokens: int
) -> dict[str, Any] | None:
    """The c=32 cell of ``scenarios`` with the most requests/s."""
    cells = [cell_row(results, name, 32, texts, tokens) for name in scenarios]
    return max((c for c in cells if c), key=lambda c: c["requests_per_s"], default=None)


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target at every measured token length (see the module docstring)."""
    rows = []
    bounds = {row["tokens"]: row for row in latency_budget(results)}
    budgets = {row["tokens"]: row for row in cpu_budget(results)}
    for tokens in measured_tokens(results):
        ceiling = best_ceiling_row(results, tokens)
        ceiling_sps = ceiling["sequences_per_s"] if ceiling else None
        for texts, share in ((1, SINGLE_TEXT_SHARE), (16, MULTI_TEXT_SHARE)):
            cell = cell_row(results, "infergate", 32, texts, tokens)
            measured = cell["sequences_per_s"] if cell else None
            row = check(
                f"infergate vs ceiling ({texts} text{'s' if texts > 1 else ''})",
                f"c=32 texts={texts} tokens={tokens}",
                measured / ceiling_sps if measured is not None and ceiling_sps else None,
                share,
                at_least=True,
                unit="x ceiling seq/s",
                missing=_missing(infergate=cell, ceiling=ceiling),
                errors=_errors(cell),
            )
            budget = budgets.get(tokens)
            if texts == 1 and row["passed"] is False and not _errors(cell) and budget:
                row["note"] = _room_note(budget, results.get("meta", {}).get("cpus") or 1)
            lean = cell_row(results, "lean", 32, texts, tokens)
            if lean and ceiling_sps:
                _add_lean_note(row, lean, f"{lean['sequences_per_s'] / ceiling_sps:.2f}")
            rows.append(row)
        for texts in (1, 16):
            ours = cell_row(results, "infergate", 32, texts, tokens)
            for other, factor in (("naive", NAIVE_FACTOR), ("ensemble", ENSEMBLE_FACTOR)):
                theirs = _best_of(results, NAIVE if other == "naive" else (other,), texts, tokens)
                if ours is None and theirs is None:
                    continue
                ratio = None
                if ours and theirs and theirs["requests_per_s"] > 0:
                    ratio = ours["requests_per_s"] / theirs["requests_per_s"]
                rows.append(
                    check(
                        f"infergate vs {other}",
                        f"c=32 texts={texts} tokens={tokens}",
                        ratio,
                        factor,
                        at_least=True,
                        unit=f"x {other} req/s",
                        missing=_missing(infergate=ours, **{other: theirs}),
                        errors=_errors(ours),
                    )
                )
        single = cell_row(results, "infergate", 1, 1, tokens)
        batch1 = ceiling_row(results, tokens, 1)
        p50 = single["p50_ms"] if single else None
        latency = check(
            "c=1 p50 <= ceiling batch-1 p50 + 1.5 ms",
            f"c=1 texts=1 tokens={tokens}",
            p50,
            latency_requirement(batch1) if batch1 else None,
            at_least=False,
            unit="ms",
            missing=_missing(infergate=single, ceiling=batch1),
            errors=_errors(single),
        )
        bound = bounds.get(tokens)
        if (
            latency["passed"] is False
            and not _errors(single)  # the note would hide the failed requests
            and bound
            and bound["bound_ms"] > BOUND_MARGIN * bound["required_ms"]
        ):
            latency["note"] = (
                f"out of reach of this layout: Triton alone {bound['triton_alone_p50_ms']:.2f} "
                f"+ floor {bound['floor_p50_ms']:.2f} = {bound['bound_ms']:.2f} ms"
            )
        if lean := cell_row(results, "lean", 1, 1, tokens):
            _add_lean_note(latency, lean, f"{lean['p50_ms']:.2f} ms")
        rows.append(latency)
        rows.append(
            check(
                "c=1 p99 <= 2 x p50",
                f"c=1 texts=1 tokens={tokens}",
                single["p99_ms"] if single else None,
                P99_OVER_P50 * p50 if p50 is not None else None,
                at_least=False,
                unit="ms",
                missing=_missing(infergate=single),
                errors=_errors(single),
            )
        )
    return rows


def _add_lean_note(row: dict[str, Any], lean: dict[str, Any], figure: str) -> None:
    """A missed target also says what the lean front-end measured in its cell, when it ran
    without errors: the same stack, none of the platform's own work."""
    if row["passed"] is False and not _errors(lean):
        row["note"] = ", ".join(
            part for part in (row["note"], f"the lean front-end {figure}") if part
        )


def _room_note(budget: dict[str, Any], cores: int) -> str:
    """What a missed single-text share leaves to the front-end (see :func:`cpu_budget`)."""
    room, own = budget["room_ms"], budget["own_work_ms"]
    if room is None:
        return ""
    needed = budget["model_cpu_ms_per_sequence"] + budget["floor_at_target_cpu_ms_per_request"]
    available = needed + room
    if needed > BOUND_MARGIN * available:
        return (
            f"out of reach of this layout: the model, the floor and the load generator take "
            f"{needed:.2f} ms/req of the {available:.2f} the cores have at the target's rate"
        )
    if room <= 0:
        return (
            f"no CPU left at the target's rate for the front-end's own work: the model, the "
            f"floor and the load generator take {needed:.2f} ms/req of {available:.2f}"
        )
    if own is None:
        return f"{room:.2f} ms/req left at the target's rate for the front-end's own work"
    note = f"own work {own:.2f} ms/req, {room:.2f} left for it at the target's rate"
    busy = budget["infergate_server_cpu_percent"]
    if own <= room and busy is not None:
        note += f"; the cores were not saturated ({busy:.0f} % of {100 * cores})"
    return note
