"""Figures read from the results document of a benchmark run: lookups of its rows, the
shares of the ceiling, the price of the Triton hop, and the CPU and latency budgets of a
single-text request.

Everything here is pure (a results document in, numbers out), so it is unit-tested
without running anything. The results document is what :func:`infergate.bench.runner.run_bench`
returns: ``meta``, ``ceiling`` (rows per token length and batch size) and ``scenarios``
(rows per cell). :mod:`infergate.bench.targets` checks the targets against it,
:mod:`infergate.bench.report` renders it and :mod:`infergate.bench.plots` draws it.
"""

from __future__ import annotations

from typing import Any

SCENARIO_ORDER = (
    "infergate", "stand-in", "lean", "inprocess", "floor", "ensemble", "naive", "naive-int8",
)  # fmt: skip
# Answer without running the model (the stand-in's costs next to nothing): no share of
# the ceiling, no line in the plots (their requests/s would flatten every other line); the
# floor bounds the others in the CPU budget.
WITHOUT_MODEL = frozenset({"floor", "stand-in"})
# The thresholds of the targets (see infergate.bench.targets) are here rather than beside
# the checks: the budgets below are read against the single-text share and the latency
# slack too.
LATENCY_SLACK_MS = 1.5
SINGLE_TEXT_SHARE = 0.55
MULTI_TEXT_SHARE = 0.85
NAIVE_FACTOR = 5.0
ENSEMBLE_FACTOR = 1.5
P99_OVER_P50 = 2.0
# A paced floor cell is read at a rate only when it ran this close to it.
PACE_MATCH = 0.1


# -- lookups ---------------------------------------------------------------------------------


def ceiling_row(results: dict[str, Any], tokens: int, batch: int) -> dict[str, Any] | None:
    ceiling = results.get("ceiling") or {}
    for row in ceiling.get("rows", []):
        if row["tokens"] == tokens and row["batch"] == batch:
            return row
    return None


def best_ceiling_row(results: dict[str, Any], tokens: int) -> dict[str, Any] | None:
    """The ceiling's fastest row at ``tokens`` (sequences/s, whatever its batch size and
    layout): every share of the ceiling divides by the best the reference did in the run."""
    rows = [r for r in (results.get("ceiling") or {}).get("rows", []) if r["tokens"] == tokens]
    return max(rows, key=lambda r: r["sequences_per_s"], default=None)


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


def ordered_scenarios(results: dict[str, Any]) -> list[str]:
    """The run's scenario names in the report's order (``SCENARIO_ORDER``), others last."""
    names = list(results.get("scenarios", {}))

    def rank(name: str) -> tuple[int, str]:
        base = name.split(" (", 1)[0]  # a variant "infergate (label)" follows infergate
        return (SCENARIO_ORDER.index(base) if base in SCENARIO_ORDER else 99, name)

    return sorted(names, key=rank)


# -- figures ---------------------------------------------------------------------------------


def ceiling_shares(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Informational: every scenario's c=32 sequences/s as a share of the ceiling's best."""
    rows = []
    for name in ordered_scenarios(results):
        if name in WITHOUT_MODEL:
            continue
        for cell in results["scenarios"][name].get("cells", []):
            ceiling = best_ceiling_row(results, cell["tokens"])
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
    ceiling = best_ceiling_row(results, tokens)
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
        ceiling = best_ceiling_row(results, tokens)
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


# -- task cells ------------------------------------------------------------------------------


def task_ceiling_best(record: dict[str, Any]) -> dict[str, Any] | None:
    """A task's fastest ceiling row (any batch size and layout)."""
    rows = (record.get("ceiling") or {}).get("rows", [])
    return max(rows, key=lambda r: r["sequences_per_s"], default=None)


def task_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per task and server in the task cells (``results["tasks"]``, see
    ``infergate.bench.task_cells``): infergate first, then the task's peers. ``share`` is
    the cell's sequences/s over the task's ceiling's fastest row; a server that failed or
    could not run has its error and no figures."""
    tasks = results.get("tasks") or {}
    rows = []
    for task, record in (tasks.get("cases") or {}).items():
        best = task_ceiling_best(record)
        ceiling_sps = best["sequences_per_s"] if best else None
        for server, served in (record.get("served") or {}).items():
            cell = served.get("cell")
            sps = cell["sequences_per_s"] if cell else None
            rows.append(
                {
                    "task": task,
                    "model": record.get("model"),
                    "weights": record.get("weights"),
                    "random_weights": bool(record.get("random_weights")),
                    "precision": served.get("precision") or record.get("precision"),
                    "server": server,
                    "setting": served.get("setting"),
                    "sequences_per_s": sps,
                    "requests_per_s": cell["requests_per_s"] if cell else None,
                    "p50_ms": cell["p50_ms"] if cell else None,
                    "p99_ms": cell["p99_ms"] if cell else None,
                    "errors": cell["errors"] if cell else None,
                    "other_cpu_percent": cell.get("other_cpu_percent") if cell else None,
                    "noisy": bool(cell.get("noisy")) if cell else False,
                    "ceiling_sequences_per_s": ceiling_sps,
                    "ceiling_batch": best["batch"] if best else None,
                    "ceiling_layout": best.get("layout") if best else None,
                    "share": sps / ceiling_sps if sps is not None and ceiling_sps else None,
                    "error": served.get("error") or (record.get("ceiling") or {}).get("error"),
                }
            )
    return rows
