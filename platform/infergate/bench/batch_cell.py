"""The batch cell: ``infergate batch`` against the in-process ceiling and the online path,
on the same texts, in one run (``infergate bench --scenarios ... batch``).

On a running stack of the bench (the ``lean`` or ``infergate`` scenario's, or one of its
own when neither runs) with the bench's model registered in its MLflow, it writes the
workload's 16-token texts into Parquet files, then measures, one after the other:

- the ceiling: ONNX Runtime in a process of its own on the served file, the texts
  tokenized beforehand, at the job's batch size (``infergate.bench.batch_ceiling``): as
  served (the figure the ratios use) and in padded batches;
- the online path: the texts through the stack's predict endpoint, ``BATCH_SIZE`` per
  request, ``ONLINE_IN_FLIGHT`` in flight, one pass, timed from first send to last answer;
- the job: ``infergate batch MODEL file out --batch-size BATCH_SIZE`` as a user runs it,
  without ``RAY_ADDRESS`` (its own Ray), on a larger file of the same texts repeated
  (``JOB_ROWS``), so that its fixed costs weigh as on a real data set: rows/s end to end
  (Ray's start and the model's loading included), its start-up (Ray's start, the slowest
  actor's load, the time to the first part), the rate from the first part's start to the
  last one's end, and "busy" rows/s (the actors' time on parts only), from the figures it
  prints, and the rows of its output read back.

The stack stays up meanwhile (idle but for the online pass), as the other cells find it.
The results go under ``batch`` in the results document.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import orjson

from infergate.bench.loadgen import HttpTarget, read_response, run_sync
from infergate.bench.options import Say
from infergate.bench.prepare import MODEL_NAME, PreparedModel
from infergate.bench.scenarios import HOST, infergate_body
from infergate.bench.stack_scenarios import INFERGATE, InfergateStack
from infergate.bench.tables import num
from infergate.bench.workload import Profile, build_text_sets

BATCH_SIZE = 32
ONLINE_IN_FLIGHT = 4
TOKENS = 16
# Texts per profile for the ceiling and the online pass, and the rows of the job's file (the
# same texts repeated): in --quick and full enough for the job's fixed costs (Ray's start,
# loading the model in each actor: about 20 s here) to weigh as on a real data set.
ROWS = {"smoke": 512, "quick": 4096, "full": 16384}
JOB_ROWS = {"smoke": 512, "quick": 65536, "full": 262144}
PART_ROWS = 4096  # rows per row group of the job's file, each a part of the job
JOB_TIMEOUT_S = 1800.0


def write_input(texts: list[str], path: Path, rows: int, part_rows: int = PART_ROWS) -> None:
    """``rows`` rows of ``texts`` (repeated) as a Parquet file with ``id`` and ``text``
    columns, in row groups of ``part_rows`` rows (at least 4, for every actor here)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    group = max(1, min(part_rows, -(-rows // 4)))
    with pq.ParquetWriter(path, pa.schema({"id": pa.int64(), "text": pa.string()})) as writer:
        for start in range(0, rows, group):
            ids = list(range(start, min(start + group, rows)))
            writer.write_table(pa.table({"id": ids, "text": [texts[i % len(texts)] for i in ids]}))


def cell_texts(prepared: PreparedModel, rows: int) -> list[str]:
    """``rows`` texts of ``TOKENS`` tokens of the bench's workload, its pool repeated."""
    pool = build_text_sets(prepared.tokenizer_dir, (TOKENS,)).by_tokens[TOKENS]
    return [pool[i % len(pool)] for i in range(rows)]


def run_ceiling(prepared: PreparedModel, input_path: Path, duration_s: float) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "infergate.bench.batch_ceiling",
        f"--onnx={prepared.onnx_path}", f"--tokenizer={prepared.tokenizer_dir}",
        f"--spec={prepared.served_dir / 'infergate.json'}", f"--texts={input_path}",
        f"--batch-size={BATCH_SIZE}", f"--duration={duration_s}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the batch ceiling failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout))


async def online_pass(target: HttpTarget, texts: list[str], in_flight: int) -> dict[str, Any]:
    """Every text once through ``target``, ``BATCH_SIZE`` per request, ``in_flight``
    requests at a time, each worker on one keep-alive connection."""
    chunks = [texts[i : i + BATCH_SIZE] for i in range(0, len(texts), BATCH_SIZE)]
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for chunk in chunks:
        queue.put_nowait(chunk)
    answered, statuses = 0, []

    async def worker() -> None:
        nonlocal answered
        reader, writer = await asyncio.open_connection(target.host, target.port)
        try:
            while not queue.empty():
                chunk = queue.get_nowait()
                writer.write(target.request_bytes(infergate_body(chunk)))
                status, body, _ = await read_response(reader)
                statuses.append(status)
                if status == 200 and len(orjson.loads(body)["outputs"]) == len(chunk):
                    answered += len(chunk)
        finally:
            writer.close()

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    duration = time.perf_counter() - began
    return {
        "rows": len(texts),
        "answered": answered,
        "requests": len(chunks),
        "errors": sum(status != 200 for status in statuses),
        "texts_per_request": BATCH_SIZE,
        "in_flight": in_flight,
        "duration_s": duration,
        "rows_per_s": answered / duration,
    }


def run_job(stack: InfergateStack, input_path: Path, output: Path) -> dict[str, Any]:
    """``infergate batch`` as a user runs it on this stack's registry, with its own Ray."""
    env = {k: v for k, v in stack.env.items() if k != "RAY_ADDRESS"}
    tracking = f"http://{HOST}:{env['INFERGATE_MLFLOW__PORT']}"
    command = [
        INFERGATE, "batch", MODEL_NAME, str(input_path), str(output),
        "--version", stack.prepared.version, "--batch-size", str(BATCH_SIZE),
        "--part-rows", str(_row_group_rows(input_path)),
        "--tracking-uri", tracking, "--quiet",
    ]  # fmt: skip
    began = time.monotonic()
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False
    )
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"infergate batch exited {done.returncode}: {done.stderr[-2000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    import pyarrow.dataset as ds

    written = ds.dataset(str(output), format="parquet").to_table(columns=["id", "error"])
    return {
        **{k: figures[k] for k in ("rows", "errors", "duration_s", "rows_per_s", "actors")},
        "busy_rows_per_s": figures["busy_rows_per_s"],
        "busy_cpu_ms_per_row": figures["busy_cpu_ms_per_row"],
        "busy_waited_share": figures["busy_waited_share"],
        # The fixed costs apart (Ray's start, the slowest actor's load, the first part's
        # start) and the rate from the first part's start to the last one's end.
        **{k: figures[k] for k in ("ray_start_s", "load_s", "startup_s", "work_s")},
        "work_rows_per_s": figures["work_rows_per_s"],
        "parts": figures["parts"],
        "command_wall_s": wall,  # the process's whole life: imports and Ray's stop too
        "output_rows": written.num_rows,
        "output_distinct_ids": len(set(written.column("id").to_pylist())),
        "output_errors": written.num_rows - written.column("error").null_count,
    }


def _row_group_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.row_group(0).num_rows)


def _part(record: dict[str, Any], name: str, say: Say, measure: Any) -> None:
    """``record[name] = measure()``, or its error there; the other parts go on."""
    try:
        record[name] = measure()
    except Exception as exc:
        record[name] = {"error": f"{type(exc).__name__}: {exc}"}
        say(f"[batch] {name} FAILED: {exc}")
        traceback.print_exc()


def ratio(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if top and bottom else None


def measure_batch_cell(
    stack: InfergateStack, profile: Profile, workdir: Path, say: Say
) -> dict[str, Any]:
    """The cell on ``stack`` (running): see the module's docstring."""
    workdir.mkdir(parents=True, exist_ok=True)
    rows = ROWS.get(profile.name, ROWS["full"])
    job_rows = JOB_ROWS.get(profile.name, JOB_ROWS["full"])
    input_path, job_path = workdir / "texts.parquet", workdir / "job.parquet"
    texts = cell_texts(stack.prepared, rows)
    write_input(texts, input_path, rows)
    write_input(texts, job_path, job_rows)
    began = time.monotonic()
    record: dict[str, Any] = {
        "stack": stack.name, "model": MODEL_NAME, "version": stack.prepared.version,
        "rows": rows, "job_rows": job_rows, "tokens": TOKENS, "batch_size": BATCH_SIZE,
        "load_average_at_start": list(os.getloadavg()),
    }  # fmt: skip
    say(f"[batch] {rows} texts of {TOKENS} tokens on the {stack.name} stack, batch {BATCH_SIZE}")
    duration = max(profile.ceiling_duration_s, 1.0)
    _part(record, "ceiling", say, lambda: run_ceiling(stack.prepared, input_path, duration))
    path = InfergateStack.path  # the platform's predict endpoint, whichever stack it is
    target = HttpTarget(HOST, stack.port, path, (infergate_body(["warm-up"]),))

    def through_the_stack() -> dict[str, Any]:
        run_sync(lambda: online_pass(target, texts[:BATCH_SIZE], 1))  # warm the route up
        return run_sync(lambda: online_pass(target, texts, ONLINE_IN_FLIGHT))

    _part(record, "online", say, through_the_stack)
    _part(record, "job", say, lambda: run_job(stack, job_path, workdir / "out"))
    record["load_average_at_end"] = list(os.getloadavg())
    record["cell_s"] = time.monotonic() - began  # what the cell adds to a run on a stack
    ceiling = record["ceiling"].get("sequences_per_s")
    padded = record["ceiling"].get("padded", {}).get("sequences_per_s")
    online = record["online"].get("rows_per_s")
    job, busy = record["job"].get("rows_per_s"), record["job"].get("busy_rows_per_s")
    work = record["job"].get("work_rows_per_s")
    # Rows per CPU second, the job's actors on parts against the ceiling's sessions: what
    # a machine shared with other work moves least (both are slowed, neither gets more).
    job_cpu = record["job"].get("busy_cpu_ms_per_row")
    ceiling_cpu = record["ceiling"].get("least_cpu_ms_per_sequence")
    record["ratios"] = {
        "cpu_over_ceiling": ratio(ceiling_cpu, job_cpu),
        "job_over_ceiling": ratio(job, ceiling),
        "work_over_ceiling": ratio(work, ceiling),
        "busy_over_ceiling": ratio(busy, ceiling),
        "busy_over_padded": ratio(busy, padded),
        "padded_over_ceiling": ratio(padded, ceiling),
        "job_over_online": ratio(job, online),
        "work_over_online": ratio(work, online),
        "busy_over_online": ratio(busy, online),
        "online_over_ceiling": ratio(online, ceiling),
    }
    failed = [name for name in ("ceiling", "online", "job") if "error" in record[name]]
    if failed:
        record["error"] = "failed: " + ", ".join(failed)
    say("[batch] rows/s: " + ", ".join(
        f"{name} {num(value)}" for name, value in
        (("job", job), ("after start-up", work), ("busy", busy), ("online", online),
         ("ceiling as served", ceiling), ("padded", padded))
    ))  # fmt: skip
    return record


def on_own_stack(
    prepared: PreparedModel, profile: Profile, workdir: Path, say: Say
) -> dict[str, Any]:
    """The cell on a stack of its own, for a run with no stack scenario."""
    stack = InfergateStack(prepared, workdir / "stack-run")
    say("[batch] starting a stack of its own")
    try:
        stack.start()
        return measure_batch_cell(stack, profile, workdir / "cell", say)
    except Exception as exc:
        say(f"[batch] FAILED: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}", "log_tail": stack.log_tail()}
    finally:
        stack.stop()
