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
    job_rows = cell.get("job_rows", cell["rows"])
    out.append(
        f"{cell['rows']} texts of {cell['tokens']} tokens (the job: {job_rows} rows of them "
        f"in one Parquet file), batch {cell['batch_size']}, on the {cell['stack']} stack. "
        "Load average at start/end: "
        + " / ".join(f"{cell[k][0]:.1f}" for k in ("load_average_at_start", "load_average_at_end"))
        + "."
        + (f" The cell took {cell['cell_s']:.0f} s." if "cell_s" in cell else "")
    )
    job, online, ceiling = cell["job"], cell["online"], cell["ceiling"]
    padded = ceiling.get("padded", {})
    ratios = cell["ratios"]

    def share(key: str) -> str:
        return num(ratios.get(key), 2)

    pool_s = (job.get("startup_s") or 0.0) - (job.get("ray_start_s") or 0.0)
    startup = (
        f"start-up {num(job.get('startup_s'))} s: Ray's start {num(job.get('ray_start_s'))} s, "
        f"then the actors' launch and load {num(pool_s)} s (the version's files and "
        f"session {num(job.get('load_s'))} s of it)"
    )
    out.append("")
    out += table(
        ["what", "rows/s", "of the ceiling", "of the online path", "note"],
        [
            ["`infergate batch`, end to end", num(job.get("rows_per_s")), share("job_over_ceiling"),
             share("job_over_online"),
             job.get("error") or f"{num(job.get('duration_s'))} s for {job.get('rows')} rows; "
             f"{startup}; {job.get('actors')} actors, {job.get('output_rows')} rows written"],
            ["`infergate batch`, after start-up", num(job.get("work_rows_per_s")),
             share("work_over_ceiling"), share("work_over_online"),
             "" if job.get("error") else
             f"first part's start to last one's end, {num(job.get('work_s'))} s"],
            ["`infergate batch`, busy (parts only)", num(job.get("busy_rows_per_s")),
             share("busy_over_ceiling"), share("busy_over_online"), ""],
            ["online path", num(online.get("rows_per_s")), share("online_over_ceiling"), "1.00",
             online.get("error") or f"{online.get('texts_per_request')} texts a request, "
             f"{online.get('in_flight')} in flight, {online.get('errors')} errors"],
            ["ceiling (ONNX Runtime in process, as served)", num(ceiling.get("sequences_per_s")),
             "1.00", "", ceiling.get("error") or f"{ceiling.get('layout')}, texts tokenized "
             "beforehand" + (", each text alone (rows_alone graph)"
                             if ceiling.get("rows_alone") else "")],
            ["the same graph in padded batches", num(padded.get("sequences_per_s")),
             share("padded_over_ceiling"), "",
             f"{padded.get('layout')}; other answers for a rows_alone graph"
             if padded else ""],
        ],
    )  # fmt: skip
    if job.get("busy_cpu_ms_per_row") and ceiling.get("least_cpu_ms_per_sequence"):
        out += ["", (
            f"CPU per row: the job's actors {num(job['busy_cpu_ms_per_row'], 2)} ms on parts, "
            f"the ceiling {num(ceiling['least_cpu_ms_per_sequence'], 2)} ms as served (its "
            "layout with the least)"
            + (f" ({num(padded['cpu_ms_per_sequence'], 2)} ms in padded batches)"
               if padded.get("cpu_ms_per_sequence") else "")
            + f": the actors do {share('cpu_over_ceiling')} of the ceiling's rows per CPU "
            "second, a ratio that other load on the machine moves less than rows/s. They "
            f"waited for a CPU {num(100 * (job.get('busy_waited_share') or 0.0), 0)} % of "
            "their time on parts."
        )]  # fmt: skip
    return out
