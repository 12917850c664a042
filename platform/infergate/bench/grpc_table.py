"""The report's rows of the gRPC cell (``infergate.bench.grpc_cell``): each way into the
front-end per cell, its figures and CPU per request by part (``infergate.bench.cost``),
and gRPC's ratios to each HTTP way measured in the same run. Pure."""

from __future__ import annotations

from typing import Any

from infergate.bench.cost import cell_cost
from infergate.bench.tables import num, table

GRPC = "grpc v2"
# What a ratio compares: higher is better for throughput, lower for the rest.
RATIO_FIGURES = ("requests_per_s", "p50_ms", "p99_ms", "replica_ms", "total_cpu_ms")


def way_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measured way and cell: load figures and CPU ms per request by part."""
    rows = []
    for row in record.get("rows", []):
        cost = cell_cost(row) or {}
        parts = cost.get("ms_per_request", {})
        rows.append({
            "cell": row["cell"], "texts": row["texts"], "way": row["way"],
            "requests_per_s": row["requests_per_s"], "sequences_per_s": row["sequences_per_s"],
            "p50_ms": row["p50_ms"], "p99_ms": row["p99_ms"], "errors": row["errors"],
            "ingress_ms": parts.get("ingress"), "replica_ms": parts.get("replica"),
            "triton_ms": parts.get("triton"), "total_cpu_ms": cost.get("total_ms_per_request"),
            "client_cpu_percent": row["client_cpu_percent"], "noisy": bool(row.get("noisy")),
        })  # fmt: skip
    return rows


def grpc_ratios(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Per cell and HTTP way, gRPC's figure over that way's (None where either is
    missing or zero, or either side had errors)."""
    rows = way_rows(record)
    ratios = []
    for grpc in (r for r in rows if r["way"] == GRPC):
        for http in (r for r in rows if r["cell"] == grpc["cell"] and r["way"] != GRPC):
            clean = not grpc["errors"] and not http["errors"]
            ratios.append({
                "cell": grpc["cell"], "over": http["way"],
                **{figure: (grpc[figure] / http[figure]
                            if clean and grpc[figure] and http[figure] else None)
                   for figure in RATIO_FIGURES},
            })  # fmt: skip
    return ratios


def grpc_section(results: dict[str, Any]) -> list[str]:
    """The report's tables of the gRPC cell; nothing when the run had none."""
    record = results.get("grpc")
    if not record:
        return []
    out = ["", "## gRPC beside HTTP: the platform's front-end each way in", ""]
    if not record.get("rows"):
        return [*out, f"Failed: {record.get('error')}"]
    ways = record["ways"]
    probe = record.get("probe", {})
    out.append(
        f"On the {record['stack']} stack, one way after the other per cell; "
        + "; ".join(f"{name}: {w['endpoint']}, {w['setting']}" for name, w in ways.items())
        + ". Answers to the probe agree: "
        + ("yes" if probe.get("agree") else f"NO ({probe.get('labels')})")
        + ". Load average at start/end: "
        + " / ".join(
            f"{record[k][0]:.1f}" for k in ("load_average_at_start", "load_average_at_end")
        )
        + f". The cell took {record.get('cell_s', 0):.0f} s."
        + (f" Failed: {record['error']}" if record.get("error") else "")
    )
    out.append("")
    out += table(
        ["cell", "way", "req/s", "seq/s", "p50 ms", "p99 ms", "errors", "ingress ms/req",
         "replica ms/req", "Triton ms/req", "total CPU ms/req", "client CPU %"],
        (
            [r["cell"], r["way"] + (" (noisy)" if r["noisy"] else ""), num(r["requests_per_s"]),
             num(r["sequences_per_s"]), num(r["p50_ms"], 2), num(r["p99_ms"], 2),
             str(r["errors"]), num(r["ingress_ms"], 3), num(r["replica_ms"], 3),
             num(r["triton_ms"], 3), num(r["total_cpu_ms"], 3), num(r["client_cpu_percent"], 0)]
            for r in way_rows(record)
        ),
    )  # fmt: skip
    out += [
        "",
        "gRPC over each HTTP way (req/s: above 1 is faster; the rest: below 1 is less):",
        "",
    ]
    out += table(
        ["cell", "over", "req/s", "p50", "p99", "replica CPU/req", "total CPU/req"],
        (
            [r["cell"], r["over"], *(num(r[figure], 2) for figure in RATIO_FIGURES)]
            for r in grpc_ratios(record)
        ),
    )  # fmt: skip
    return out
