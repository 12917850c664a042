"""Targets, the markdown report, plots and the JSON file of a benchmark run.

Everything here is pure (a results document in, text or files out), so it is unit-tested
without running anything. The results document is what :func:`infergate.bench.runner.run_bench`
returns: ``meta``, ``ceiling`` (rows per token length and batch size) and ``scenarios``
(rows per cell); :func:`evaluate_targets` adds nothing to it but reads it.

Targets (from issue #5), each a row with pass/fail, never dropped when it cannot be
computed (it then says what is missing):

- single text, c=32: infergate req/s >= 0.55 x ceiling seq/s at batch 32;
- 16 texts, c=32: infergate seq/s >= 0.85 x ceiling seq/s at batch 32;
- every c=32 cell: infergate >= 5 x naive and >= 1.5 x ensemble (requests/s);
- single text, c=1: infergate p50 <= ceiling batch-1 p50 + 1.5 ms, and p99 <= 2 x p50.

Each is checked at every token length measured; a cell with errors fails. A missed c=1
target whose requirement lies below what Triton alone and the floor take together (see
:func:`latency_budget`) says so in its note; a missed single-text share says what the
front-end's own work costs per request and how much the target's rate leaves for it (see
:func:`cpu_budget`); a missed share of the ceiling also says what the lean front-end on
the same stack reached (``infergate.bench.lean``), when it ran, and so does a missed c=1
median.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SCENARIO_ORDER = ("infergate", "lean", "inprocess", "floor", "ensemble", "naive")
# Answers without running the model: no share of the ceiling, no line in the plots (its
# requests/s would flatten every other line); it bounds the others in the CPU budget.
WITHOUT_MODEL = frozenset({"floor"})
CEILING_BATCH = 32
LATENCY_SLACK_MS = 1.5
SINGLE_TEXT_SHARE = 0.55
MULTI_TEXT_SHARE = 0.85
NAIVE_FACTOR = 5.0
ENSEMBLE_FACTOR = 1.5
P99_OVER_P50 = 2.0
# A missed c=1 target is called out of reach of the layout only when the sum of the two
# medians below which no front-end can answer (see latency_budget) exceeds the requirement
# by more than this much of it: one run's medians are estimates, not strict bounds.
BOUND_MARGIN = 1.1
# A paced floor cell is read at a rate only when it ran this close to it.
PACE_MATCH = 0.1


# -- lookups ---------------------------------------------------------------------------------


def ceiling_row(results: dict[str, Any], tokens: int, batch: int) -> dict[str, Any] | None:
    ceiling = results.get("ceiling") or {}
    for row in ceiling.get("rows", []):
        if row["tokens"] == tokens and row["batch"] == batch:
            return row
    return None


def cell_row(
    results: dict[str, Any], scenario: str, concurrency: int, texts: int, tokens: int
) -> dict[str, Any] | None:
    record = results.get("scenarios", {}).get(scenario) or {}
    for row in record.get("cells", []):
        if (row["concurrency"], row["texts"], row["tokens"]) == (concurrency, texts, tokens):
            return row
    return None


def measured_tokens(results: dict[str, Any]) -> list[int]:
    found = {
        row["tokens"] for r in results.get("scenarios", {}).values() for row in r.get("cells", [])
    }
    found |= {row["tokens"] for row in (results.get("ceiling") or {}).get("rows", [])}
    return sorted(found)


# -- targets ---------------------------------------------------------------------------------


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


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target at every measured token length (see the module docstring)."""
    rows = []
    bounds = {row["tokens"]: row for row in latency_budget(results)}
    budgets = {row["tokens"]: row for row in cpu_budget(results)}
    for tokens in measured_tokens(results):
        ceiling = ceiling_row(results, tokens, CEILING_BATCH)
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
                theirs = cell_row(results, other, 32, texts, tokens)
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


def ceiling_shares(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Informational: every scenario's c=32 sequences/s as a share of the ceiling's."""
    rows = []
    for name in _scenarios(results):
        if name in WITHOUT_MODEL:
            continue
        for cell in results["scenarios"][name].get("cells", []):
            ceiling = ceiling_row(results, cell["tokens"], CEILING_BATCH)
            if cell["concurrency"] == 32 and ceiling and ceiling["sequences_per_s"] > 0:
                share = cell["sequences_per_s"] / ceiling["sequences_per_s"]
                rows.append({"scenario": name, "cell": cell["cell"], "share": share})
    return rows


def triton_hop(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Informational: in-process front-end vs the platform, per common cell."""
    rows = []
    for ours in (results.get("scenarios", {}).get("infergate") or {}).get("cells", []):
        theirs = cell_row(results, "inprocess", ours["concurrency"], ours["texts"], ours["tokens"])
        if theirs and ours["requests_per_s"] > 0:
            rows.append(
                {
                    "cell": ours["cell"],
                    "infergate_rps": ours["requests_per_s"],
                    "inprocess_rps": theirs["requests_per_s"],
                    "inprocess_over_infergate": theirs["requests_per_s"] / ours["requests_per_s"],
                    "p50_saved_ms": ours["p50_ms"] - theirs["p50_ms"],
                }
            )
    return rows


def single_text_target_rps(results: dict[str, Any], tokens: int) -> float | None:
    """The single-text requests/s at c=32 the ceiling target asks of infergate."""
    ceiling = ceiling_row(results, tokens, CEILING_BATCH)
    return SINGLE_TEXT_SHARE * ceiling["sequences_per_s"] if ceiling else None


def paced_floor_row(
    results: dict[str, Any], tokens: int, purpose: str, rps: float | None
) -> dict[str, Any] | None:
    """The floor's single-text cell paced for ``purpose`` (``runner.measure_paced``), if it
    ran within ``PACE_MATCH`` of ``rps``: a figure at another rate would not compare."""
    record = results.get("scenarios", {}).get("floor") or {}
    for row in record.get("paced_cells", []):
        if (row["tokens"], row.get("paced_for")) != (tokens, purpose) or not rps:
            continue
        if abs(row["requests_per_s"] / rps - 1) <= PACE_MATCH:
            return row
    return None


def _ms_per_request(percent: float | None, row: dict[str, Any]) -> float | None:
    """Percent of one core over a cell, as CPU milliseconds per request of it."""
    if percent is None or not row.get("requests_per_s"):
        return None
    return float(percent) * 10.0 / row["requests_per_s"]


def cpu_ms_per_request(row: dict[str, Any], component: str = "total") -> float | None:
    """CPU milliseconds one request of a cell cost ``component`` (all cores together)."""
    return _ms_per_request(row.get("server_cpu_percent", {}).get(component), row)


def cpu_budget(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Informational: how much CPU the single-text target leaves a Ray Serve front-end.

    Both cores are busy at c=32, so requests/s is the machine's CPU over the CPU one
    request costs. A request costs at least the model's own CPU per sequence (the
    ceiling's) plus what the floor spends per request on Ray Serve's ingress and replica
    with no work at all, and the load generator shares the cores. Flat out, the floor's
    replica handles many requests per turn of its event loop, and Ray's background CPU
    is spread over many requests; at a given rate (:func:`paced_floor_row`) each request
    costs what it costs a front-end running at that rate.

    - ``room_ms``: the machine's CPU per request at the target's rate, minus the model's,
      the floor's and the load generator's there (floor paced to that rate): what
      tokenizing, the handler, the Triton hop and any model CPU beyond the ceiling's may
      cost together if the target is to be met with both cores busy;
    - ``own_work_ms``: what infergate spends on them (its CPU per request minus the
      model's and the floor's, the floor paced to infergate's own rate);
    - ``bound_share``: the share of the ceiling a front-end whose own work cost nothing
      would reach (the floor paced to the target's rate where measured, else flat out).
    """
    cores = results.get("meta", {}).get("cpus") or 1
    rows = []
    for tokens in measured_tokens(results):
        ceiling = ceiling_row(results, tokens, CEILING_BATCH)
        floor = cell_row(results, "floor", 32, 1, tokens)
        if not ceiling or not floor or floor.get("noisy") or not ceiling.get("cpu_ms_per_sequence"):
            continue
        model_ms, floor_ms = ceiling["cpu_ms_per_sequence"], cpu_ms_per_request(floor)
        if floor_ms is None:
            continue
        target_rps = single_text_target_rps(results, tokens)
        ours = cell_row(results, "infergate", 32, 1, tokens)
        ours_ms = cpu_ms_per_request(ours) if ours else None
        at_target = paced_floor_row(results, tokens, "target", target_rps)
        at_ours = paced_floor_row(
            results, tokens, "infergate", ours["requests_per_s"] if ours else None
        )
        # At the target's rate: the floor's server CPU and the load generator's, per request.
        below_ms = (
            _ms_per_request(
                at_target["server_cpu_percent"]["total"] + at_target["client_cpu_percent"],
                at_target,
            )
            if at_target
            else None
        )
        floor_at_ours_ms = cpu_ms_per_request(at_ours) if at_ours else None
        rows.append(
            {
                "tokens": tokens,
                "model_cpu_ms_per_sequence": model_ms,
                "floor_cpu_ms_per_request": floor_ms,
                "target_requests_per_s": target_rps,
                "floor_at_target_cpu_ms_per_request": below_ms,
                "floor_at_infergate_cpu_ms_per_request": floor_at_ours_ms,
                "infergate_cpu_ms_per_request": ours_ms,
                "room_ms": (
                    cores * 1e3 / target_rps - model_ms - below_ms
                    if target_rps and below_ms is not None
                    else None
                ),
                "own_work_ms": (
                    ours_ms - model_ms - floor_at_ours_ms
                    if ours_ms is not None and floor_at_ours_ms is not None
                    else None
                ),
                "bound_share": cores
                * 1e3
                / (model_ms + (below_ms if below_ms is not None else floor_ms))
                / ceiling["sequences_per_s"],
                "infergate_share": (
                    ours["sequences_per_s"] / ceiling["sequences_per_s"] if ours else None
                ),
                "infergate_server_cpu_percent": (
                    ours["server_cpu_percent"].get("total") if ours else None
                ),
            }
        )
    return rows


def latency_requirement(ceiling_batch1: dict[str, Any]) -> float:
    """The c=1 p50 the target allows: the ceiling's batch-1 p50 plus the slack."""
    return ceiling_batch1["p50_ms"] + LATENCY_SLACK_MS


def latency_budget(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Informational: an estimate of the least single-text p50 at c=1 that a Ray Serve
    front-end in front of this Triton can reach.

    A request goes through Ray Serve's ingress and a replica (the floor's p50, which
    answers without working) and through Triton (the platform's Triton called straight,
    pre-tokenized: ``triton_alone`` of the infergate scenario). ``bound_ms`` is the sum of
    the two medians, to read beside the c=1 target's requirement.
    """
    alone = {
        row["tokens"]: row
        for row in (results.get("scenarios", {}).get("infergate") or {}).get("triton_alone", [])
    }
    rows = []
    for tokens in measured_tokens(results):
        floor = cell_row(results, "floor", 1, 1, tokens)
        batch1 = ceiling_row(results, tokens, 1)
        # A floor disturbed by other load (another stack running beside the benchmark,
        # say) bounds nothing: no estimate rather than a wrong one.
        if tokens not in alone or not floor or floor.get("noisy") or not batch1:
            continue
        ours = cell_row(results, "infergate", 1, 1, tokens)
        triton_ms, floor_ms = alone[tokens]["p50_ms"], floor["p50_ms"]
        rows.append(
            {
                "tokens": tokens,
                "ceiling_batch1_p50_ms": batch1["p50_ms"],
                "required_ms": latency_requirement(batch1),
                "triton_alone_p50_ms": triton_ms,
                "triton_alone_other_p50_ms": alone[tokens].get("other_p50_ms"),
                "floor_p50_ms": floor_ms,
                "bound_ms": triton_ms + floor_ms,
                "infergate_p50_ms": ours["p50_ms"] if ours else None,
            }
        )
    return rows


# -- markdown --------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _per_length_section(
    title: str, rows: list[dict[str, Any]], columns: dict[str, str], note: str
) -> list[str]:
    """A section with one line per token length (``columns`` maps headers to the rows'
    keys, 2 decimals) and a note under the table; nothing without rows."""
    if not rows:
        return []
    return [
        "",
        f"## {title}",
        "",
        *_table(
            ["tokens", *columns],
            ([str(row["tokens"]), *(_num(row[key], 2) for key in columns.values())]
             for row in rows),
        ),
        "",
        note,
    ]  # fmt: skip


def verdict(row: dict[str, Any]) -> str:
    if row["passed"] is None:
        return f"n/a ({row['note']})"
    if row["passed"]:
        return "PASS"
    side = "short" if row["comparison"] == ">=" else "over"
    short = f"{row['shortfall']:.0%} {side}" if row["shortfall"] is not None else ""
    return "MISS " + ", ".join(part for part in (short, row["note"]) if part)


def _top_cpu(row: dict[str, Any], limit: int = 4) -> str:
    parts = [(k, v) for k, v in row.get("server_cpu_percent", {}).items() if k != "total"]
    parts.sort(key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v:.0f}%" for k, v in parts[:limit])


def markdown(results: dict[str, Any]) -> str:
    """The human-readable report."""
    meta = results.get("meta", {})
    out = [f"# infergate benchmark ({meta.get('profile', '?')})", ""]
    out.append(
        f"{meta.get('date', '?')} on {meta.get('host', '?')}: {meta.get('cpus', '?')} CPUs "
        f"({meta.get('cpu', '?')}), {meta.get('memory_gib', '?')} GiB, commit "
        f"{meta.get('git_commit') or '?'}. Model: {meta.get('model', {}).get('name', '?')} v"
        f"{meta.get('model', {}).get('version', '?')} "
        f"({meta.get('model', {}).get('precision', '?')}). {meta.get('duration_s', '?')} s per "
        f"cell after {meta.get('warmup_s', '?')} s warm-up. Load average at start/end: "
        f"{_loads(meta.get('load_average_at_start'))} / {_loads(meta.get('load_average_at_end'))}."
    )
    if meta.get("env_overrides"):
        out += [
            "",
            "Overrides: " + ", ".join(f"`{k}={v}`" for k, v in meta["env_overrides"].items()),
        ]
    out += ["", "## Targets", ""]
    out += _table(
        ["target", "cell", "measured", "required", "result"],
        (
            [
                r["target"],
                r["cell"],
                f"{_num(r['value'], 2)} {r['unit']}",
                f"{r['comparison']} {_num(r['required'], 2)}",
                verdict(r),
            ]
            for r in evaluate_targets(results)
        ),
    )
    ceiling = results.get("ceiling") or {}
    out += ["", "## Ceiling: ONNX Runtime in process on the served file", ""]
    if ceiling.get("error"):
        out.append(f"FAILED: {ceiling['error']}")
    out += _table(
        ["tokens", "batch", "layout", "seq/s", "other run seq/s", "p50 ms", "p95 ms",
         "p99 ms", "other CPU %"],
        (
            [str(r["tokens"]), str(r["batch"]), r.get("layout", "-"), _num(r["sequences_per_s"]),
             _num(r.get("slower_run_sequences_per_s"))]
            + [_num(r[k], 2) for k in ("p50_ms", "p95_ms", "p99_ms")]
            + [_other(r)]
            for r in ceiling.get("rows", [])
        ),
    )  # fmt: skip
    out += ["", "One session with a thread per core; the largest batch also with a session "
            "per core, one thread each, side by side, keeping the better layout (the other "
            "is in the JSON). Inputs tokenized beforehand. Measured at "
            "the start and at the end of the run; each row keeps the faster run (so the "
            "ratios never gain from a slow phase of the host), the other is beside it. "
            "A row disturbed by other load (over 10% of a core) was measured again."]  # fmt: skip
    out += ["", "## Scenarios", ""]
    rows, failures = [], []
    for name in _scenarios(results):
        record = results["scenarios"][name]
        if record.get("error"):
            failures.append(f"- **{name}** failed: {record['error']}")
        probe = record.get("probe", {})
        if probe and probe.get("agrees_with_ceiling") is False:
            failures.append(
                f"- **{name}** probe labels {probe.get('labels')} differ from the ceiling's"
            )
        for r in record.get("cells", []):
            rows.append(
                [name, str(r["concurrency"]), str(r["texts"]), str(r["tokens"])]
                + [_num(r["requests_per_s"]), _num(r["sequences_per_s"])]
                + [_num(r[k], 2) for k in ("p50_ms", "p95_ms", "p99_ms")]
                + [str(r["errors"]), _num(r["server_cpu_percent"].get("total"), 0)]
                + [_num(r["client_cpu_percent"], 0), _other(r)]
            )
    header = ["scenario", "c", "texts", "tokens", "req/s", "seq/s", "p50 ms", "p95 ms", "p99 ms"]
    header += ["errors", "server CPU %", "client CPU %", "other CPU %"]
    out += _table(header, rows)
    cores = meta.get("cpus", "?")
    note = (
        f"CPU % is of one core over the cell (the box has {cores} cores); 'other' is everything"
        " else running on the box meanwhile; a cell it disturbed (over 30%) was measured again"
        " and the quietest attempt kept, '(noisy)' if none was quiet."
    )
    out += ["", note]
    if failures:
        out += ["", *failures]
    out += ["", "## Memory (peak over the cells)", ""]
    out += _table(
        ["scenario", "RSS MiB", "PSS MiB", "processes", "by component (RSS MiB)"],
        _memory_rows(results),
    )
    out += ["", "## Where the CPU goes (c=32 cells)", ""]
    out += _table(
        ["scenario", "cell", "server CPU %", "top components", "Triton batching"],
        (
            [
                name,
                r["cell"],
                _num(r["server_cpu_percent"].get("total"), 0),
                _top_cpu(r),
                _batching(r),
            ]
            for name in _scenarios(results)
            for r in results["scenarios"][name].get("cells", [])
            if r["concurrency"] == 32
        ),
    )
    shares = ceiling_shares(results)
    if shares:
        out += ["", "## Share of the ceiling (seq/s at c=32 over ceiling seq/s at batch 32)", ""]
        out += _table(
            ["scenario", "cell", "share"],
            ([s["scenario"], s["cell"], _num(s["share"], 2)] for s in shares),
        )
    out += _per_length_section(
        "CPU budget of a single-text request (c=32)",
        cpu_budget(results),
        {
            "model CPU ms/seq (ceiling)": "model_cpu_ms_per_sequence",
            "floor CPU ms/req flat out": "floor_cpu_ms_per_request",
            "target req/s": "target_requests_per_s",
            "floor + load generator at the target ms/req": "floor_at_target_cpu_ms_per_request",
            "room at the target ms/req": "room_ms",
            "infergate CPU ms/req": "infergate_cpu_ms_per_request",
            "floor at infergate's rate ms/req": "floor_at_infergate_cpu_ms_per_request",
            "infergate own work ms/req": "own_work_ms",
            "best share possible": "bound_share",
            "infergate share": "infergate_share",
        },
        "CPU per request, both cores together. Flat out: the floor's c=32 cell as fast as it "
        "goes. At a rate: the same cell with every answer held back so that it runs at "
        f"that rate: the target's ({SINGLE_TEXT_SHARE} of the ceiling) or the one "
        "infergate reached; at a lower rate Ray's background CPU is spread over fewer "
        "requests, and the replica handles fewer per turn of its event loop. Room at the "
        "target: the cores' CPU per request at the target's rate minus the model's, the "
        "floor's and the load generator's there: what tokenizing, the handler, the Triton "
        "hop and any model CPU beyond the ceiling's may cost together for the target to be "
        "met. Infergate own work: what they cost in this run (its CPU per request minus "
        "the model's and the floor's at its rate). Best share possible: a front-end whose "
        "own work cost nothing. A paced cell more than "
        f"{PACE_MATCH:.0%} off its rate is not read.",
    )
    out += _per_length_section(
        "Latency budget of a single-text request (c=1)",
        latency_budget(results),
        {
            "required p50 ms": "required_ms",
            "Triton alone p50 ms": "triton_alone_p50_ms",
            "other run ms": "triton_alone_other_p50_ms",
            "floor p50 ms": "floor_p50_ms",
            "estimated least ms": "bound_ms",
            "infergate p50 ms": "infergate_p50_ms",
        },
        "Triton alone: the platform's gRPC client calling its Triton model straight with "
        "pre-tokenized text, one call at a time, before and after the stack's cells; the "
        "faster run is kept, the other is beside it. Estimated least: its median plus the "
        "floor's, a Ray Serve replica that answers without working.",
    )
    hop = triton_hop(results)
    if hop:
        out += ["", "## Price of the Triton hop (in-process front-end vs infergate)", ""]
        out += _table(
            ["cell", "infergate req/s", "in-process req/s", "ratio", "p50 saved ms"],
            (
                [
                    h["cell"],
                    _num(h["infergate_rps"]),
                    _num(h["inprocess_rps"]),
                    _num(h["inprocess_over_infergate"], 2),
                    _num(h["p50_saved_ms"], 2),
                ]
                for h in hop
            ),
        )
    return "\n".join(out) + "\n"


def _batching(row: dict[str, Any]) -> str:
    """What Triton's dynamic batcher did per model during a cell."""
    return "; ".join(
        f"{model}: {t['rows_per_execution']:.1f} rows/exec, queue {t['queue_ms_per_request']:.2f}"
        f" ms/req, compute {t['compute_ms_per_execution']:.2f} ms/exec"
        for model, t in sorted(row.get("triton", {}).items())
    )


def _other(row: dict[str, Any]) -> str:
    """Other load on the box during a measurement, flagged when it disturbed it."""
    text = _num(row.get("other_cpu_percent"), 0)
    return text + " (noisy)" if row.get("noisy") else text


def _loads(values: list[float] | None) -> str:
    return "/".join(f"{v:.2f}" for v in values) if values else "?"


def _scenarios(results: dict[str, Any]) -> list[str]:
    names = list(results.get("scenarios", {}))

    def rank(name: str) -> tuple[int, str]:
        base = name.split(" (", 1)[0]  # a variant "infergate (label)" follows infergate
        return (SCENARIO_ORDER.index(base) if base in SCENARIO_ORDER else 99, name)

    return sorted(names, key=rank)


def _memory_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    memories = [("ceiling", (results.get("ceiling") or {}).get("memory") or {})]
    memories += [(n, results["scenarios"][n].get("memory") or {}) for n in _scenarios(results)]
    for name, memory in memories:
        total = memory.get("total")
        if not total:
            continue
        parts = sorted(
            ((k, v) for k, v in memory.items() if k != "total"), key=lambda kv: -kv[1]["rss_mb"]
        )
        detail = ", ".join(f"{k} {v['rss_mb']:.0f} ({v['processes']:.0f})" for k, v in parts)
        rows.append(
            [
                name,
                _num(total["rss_mb"], 0),
                _num(total["pss_mb"], 0),
                str(int(total["processes"])),
                detail,
            ]
        )
    return rows


# -- files -----------------------------------------------------------------------------------


def write_report(results: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write ``results.json`` (with the targets), ``results.md`` and the PNG plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {
        **results,
        "targets": evaluate_targets(results),
        "ceiling_shares": ceiling_shares(results),
        "triton_hop": triton_hop(results),
        "cpu_budget": cpu_budget(results),
        "latency_budget": latency_budget(results),
    }
    files = {"json": out_dir / "results.json", "markdown": out_dir / "results.md"}
    files["json"].write_text(json.dumps(document, indent=2, default=str) + "\n")
    files["markdown"].write_text(markdown(results))
    from infergate.bench.plots import write_plots

    files.update(write_plots(results, out_dir))
    return files
