"""The report of a benchmark run: its markdown, and its results folder.

:func:`markdown` renders a results document (see :mod:`infergate.bench.analysis`) and its
targets (:mod:`infergate.bench.targets`) as text; :func:`write_report` writes the folder:
``results.json`` (the document with the targets and the derived figures), ``results.md``
and the PNG plots (:mod:`infergate.bench.plots`). A committed run's ``results.md`` can be
rendered again from its ``results.json`` with :func:`markdown`: the derived figures in the
JSON are computed again, not read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infergate.bench.analysis import (
    PACE_MATCH,
    SINGLE_TEXT_SHARE,
    ceiling_shares,
    cpu_budget,
    latency_budget,
    ordered_scenarios,
    task_rows,
    triton_hop,
)
from infergate.bench.batch_table import batch_section
from infergate.bench.cost import cost_rows, cost_section, gpu_rate
from infergate.bench.grpc_table import grpc_ratios, grpc_section, way_rows
from infergate.bench.plots import write_plots
from infergate.bench.tables import num, table
from infergate.bench.targets import evaluate_targets

# -- markdown --------------------------------------------------------------------------------


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
        *table(
            ["tokens", *columns],
            ([str(row["tokens"]), *(num(row[key], 2) for key in columns.values())]
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
    if results.get("scenarios") or results.get("ceiling"):
        out += _scenario_sections(results)
    out += _task_section(results)
    out += grpc_section(results)
    out += batch_section(results)
    return "\n".join(out) + "\n"


def _scenario_sections(results: dict[str, Any]) -> list[str]:
    """Targets, the ceiling, every scenario's cells and the figures derived from them."""
    meta = results.get("meta", {})
    out: list[str] = []
    out += ["", "## Targets", ""]
    out += table(
        ["target", "cell", "measured", "required", "result"],
        (
            [
                r["target"],
                r["cell"],
                f"{num(r['value'], 2)} {r['unit']}",
                f"{r['comparison']} {num(r['required'], 2)}",
                verdict(r),
            ]
            for r in evaluate_targets(results)
        ),
    )
    ceiling = results.get("ceiling") or {}
    out += ["", "## Ceiling: ONNX Runtime in process on the served file", ""]
    if ceiling.get("error"):
        out.append(f"FAILED: {ceiling['error']}")
    out += table(
        ["tokens", "batch", "layout", "seq/s", "other run seq/s", "p50 ms", "p95 ms",
         "p99 ms", "other CPU %"],
        (
            [str(r["tokens"]), str(r["batch"]), r.get("layout", "-"), num(r["sequences_per_s"]),
             num(r.get("slower_run_sequences_per_s"))]
            + [num(r[k], 2) for k in ("p50_ms", "p95_ms", "p99_ms")]
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
    for name in ordered_scenarios(results):
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
                + [num(r["requests_per_s"]), num(r["sequences_per_s"])]
                + [num(r[k], 2) for k in ("p50_ms", "p95_ms", "p99_ms")]
                + [str(r["errors"]), num(r["server_cpu_percent"].get("total"), 0)]
                + [num(r["client_cpu_percent"], 0), _other(r)]
            )
    header = ["scenario", "c", "texts", "tokens", "req/s", "seq/s", "p50 ms", "p95 ms", "p99 ms"]
    header += ["errors", "server CPU %", "client CPU %", "other CPU %"]
    out += table(header, rows)
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
    out += table(
        ["scenario", "RSS MiB", "PSS MiB", "processes", "by component (RSS MiB)"],
        _memory_rows(results),
    )
    out += ["", "## Where the CPU goes (c=32 cells)", ""]
    out += table(
        ["scenario", "cell", "server CPU %", "top components", "Triton batching"],
        (
            [
                name,
                r["cell"],
                num(r["server_cpu_percent"].get("total"), 0),
                _top_cpu(r),
                _batching(r),
            ]
            for name in ordered_scenarios(results)
            for r in results["scenarios"][name].get("cells", [])
            if r["concurrency"] == 32
        ),
    )
    out += cost_section(results)
    shares = ceiling_shares(results)
    if shares:
        out += ["", "## Share of the ceiling (seq/s at c=32 over the ceiling's best seq/s)", ""]
        out += table(
            ["scenario", "cell", "share"],
            ([s["scenario"], s["cell"], num(s["share"], 2)] for s in shares),
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
        out += table(
            ["cell", "infergate req/s", "in-process req/s", "ratio", "p50 saved ms"],
            (
                [
                    h["cell"],
                    num(h["infergate_rps"]),
                    num(h["inprocess_rps"]),
                    num(h["inprocess_over_infergate"], 2),
                    num(h["p50_saved_ms"], 2),
                ]
                for h in hop
            ),
        )
    return out


def _task_section(results: dict[str, Any]) -> list[str]:
    """The task cells (``task_rows``): a row per task and server, with its share of the
    task's own ceiling; nothing when the run had none."""
    tasks = results.get("tasks")
    if not tasks:
        return []
    cell = tasks.get("cell", {})
    out = ["", "## Tasks", ""]
    out += table(
        ["task", "model", "served by", "seq/s", "req/s", "p50 ms", "p99 ms", "errors",
         "other CPU %", "ceiling seq/s (batch, layout)", "share of ceiling"],
        (
            [r["task"], f"{r['model']} ({r['precision'] or '?'})",
             r["server"] + (f" ({r['setting']})" if r["setting"] else ""),
             num(r["sequences_per_s"]), num(r["requests_per_s"]), num(r["p50_ms"], 2),
             num(r["p99_ms"], 2), "-" if r["errors"] is None else str(r["errors"]),
             _other(r),
             f"{num(r['ceiling_sequences_per_s'])} ({r['ceiling_batch']}, "
             f"{r['ceiling_layout']})" if r["ceiling_sequences_per_s"] else "-",
             num(r["share"], 2) if r["error"] is None else f"failed: {r['error']}"]
            for r in task_rows(results)
        ),
    )  # fmt: skip
    models = {}
    for task, record in (tasks.get("cases") or {}).items():
        models[task] = f"- {task}: {record.get('model')}, {record.get('weights')}"
        for name, served in (record.get("served") or {}).items():
            if name != "infergate" and served.get("error") and not served.get("cell"):
                models[task] += f"; {name} could not run: {served['error']}"
            elif served.get("cosine_to_infergate") is not None:
                models[task] += (
                    f"; {name}'s vectors against infergate's, same texts: least cosine "
                    f"{served['cosine_to_infergate']:.4f}"
                )
            for tried in served.get("settings", []):
                if tried.get("error") and served.get("cell"):
                    first = tried["error"].splitlines()[0]
                    models[task] += f"; {name} ({tried['setting']}) failed: {first}"
    out += [
        "",
        f"Concurrency {cell.get('concurrency', '?')}, {cell.get('texts', '?')} texts of about "
        f"{cell.get('tokens', '?')} tokens per request, every task's model served by one stack. "
        "The ceiling: ONNX Runtime in one process on the file the stack serves (for "
        "translation CTranslate2 on its served folder, decoding as many tokens as the "
        "requests ask), inputs "
        "tokenized beforehand as the task's front-end does, its fastest batch and layout; "
        "measured before and after the cells, each row keeping the faster run. A peer is "
        "tried in each setting listed in the JSON and its fastest kept; it runs its own "
        "model file (fastembed and infinity's optimum engine an fp32 ONNX export, "
        "infinity's torch engine the Hugging Face folder), so its share compares it with "
        "what infergate serves, not with the file it runs. Models (random weights cost "
        "the same to run as trained ones of the same shape):",
        "",
        *models.values(),
    ]
    return out


def _batching(row: dict[str, Any]) -> str:
    """What Triton's dynamic batcher did per model during a cell."""
    return "; ".join(
        f"{model}: {t['rows_per_execution']:.1f} rows/exec, queue {t['queue_ms_per_request']:.2f}"
        f" ms/req, compute {t['compute_ms_per_execution']:.2f} ms/exec"
        for model, t in sorted(row.get("triton", {}).items())
    )


def _other(row: dict[str, Any]) -> str:
    """Other load on the box during a measurement, flagged when it disturbed it."""
    text = num(row.get("other_cpu_percent"), 0)
    return text + " (noisy)" if row.get("noisy") else text


def _loads(values: list[float] | None) -> str:
    return "/".join(f"{v:.2f}" for v in values) if values else "?"


def _memory_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    memories = [("ceiling", (results.get("ceiling") or {}).get("memory") or {})]
    memories += [
        (n, results["scenarios"][n].get("memory") or {}) for n in ordered_scenarios(results)
    ]
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
                num(total["rss_mb"], 0),
                num(total["pss_mb"], 0),
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
        "task_rows": task_rows(results),
        "cost": cost_rows(results, gpu_rate(results)),
        "grpc_rows": way_rows(results.get("grpc") or {}),
        "grpc_ratios": grpc_ratios(results.get("grpc") or {}),
    }
    files = {"json": out_dir / "results.json", "markdown": out_dir / "results.md"}
    files["json"].write_text(json.dumps(document, indent=2, default=str) + "\n")
    files["markdown"].write_text(markdown(results))
    if results.get("scenarios"):  # the plots draw the scenarios' cells
        files.update(write_plots(results, out_dir))
    return files
