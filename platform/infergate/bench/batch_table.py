"""The report's table of the batch cell (``infergate.bench.batch_cell``)."""

from __future__ import annotations

from typing import Any

from infergate.bench.tables import num, table


def batch_section(results: dict[str, Any]) -> list[str]:
    """The report's table of the batch cell; nothing when the run had none."""
    cell = results.get("batch")
    if not cell:
        return []
    out = ["", "## Batch: `infergate batch` against the ceiling and the online path", ""]
    if "rows" not in cell:
        return [*out, f"Failed: {cell.get('error')}"]
    out.append(
        f"{cell['rows']} texts of {cell['tokens']} tokens in one Parquet file, batch "
        f"{cell['batch_size']}, on the {cell['stack']} stack. Load average at start/end: "
        + " / ".join(f"{cell[k][0]:.1f}" for k in ("load_average_at_start", "load_average_at_end"))
        + "."
        + (f" The cell took {cell['cell_s']:.0f} s." if "cell_s" in cell else "")
    )
    job, online, ceiling = cell["job"], cell["online"], cell["ceiling"]
    ratios = cell["ratios"]

    def share(key: str) -> str:
        return num(ratios.get(key), 2)

    out.append("")
    out += table(
        ["what", "rows/s", "of the ceiling", "of the online path", "note"],
        [
            ["`infergate batch`, end to end", num(job.get("rows_per_s")), share("job_over_ceiling"),
             share("job_over_online"),
             job.get("error") or f"{num(job.get('duration_s'))} s with Ray's start and loading; "
             f"{job.get('actors')} actors, {job.get('output_rows')} rows written"],
            ["`infergate batch`, busy (parts only)", num(job.get("busy_rows_per_s")),
             share("busy_over_ceiling"), share("busy_over_online"), ""],
            ["online path", num(online.get("rows_per_s")), share("online_over_ceiling"), "1.00",
             online.get("error") or f"{online.get('texts_per_request')} texts a request, "
             f"{online.get('in_flight')} in flight, {online.get('errors')} errors"],
            ["ceiling (ONNX Runtime in process)", num(ceiling.get("sequences_per_s")), "1.00", "",
             ceiling.get("error") or f"{ceiling.get('layout')}, texts tokenized beforehand"],
        ],
    )  # fmt: skip
    return out
