"""Running one batch job: checks before any work, the parts left to do, Ray Data actors
sized from the cluster, a progress line, and the job's MLflow run.

With ``RAY_ADDRESS`` set the job runs on that cluster (INPUT and OUTPUT must then be
reachable from every node: shared storage or a URL); without it, Ray starts on this
machine for the job's length (its own instance, beside any other Ray running here).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from infergate.batch.files import Part, columns_of, filesystem, input_files, plan, written_parts
from infergate.batch.options import JobOptions, check_columns, check_task_options, format_of
from infergate.batch.worker import PartRunner, WorkerSpec
from infergate.errors import BatchError, ModelNotFound
from infergate.protocols.wire import Limits
from infergate.tasks import get as get_task
from infergate.versions import ServedVersion

if TYPE_CHECKING:
    from infergate.registry import Registry

log = logging.getLogger(__name__)
WORKER_ENV = {
    # The actors' downloads of the version's files: no progress bars between our lines.
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # One thread tokenizes in each actor (infergate.serving.tokenization.tokenize_serially).
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass(frozen=True)
class Planned:
    served: ServedVersion
    input_format: str
    output_format: str
    parts: list[Part]  # every part of the input
    todo: list[Part]  # those without an output file yet


def resolve_version(registry: Registry, options: JobOptions) -> ServedVersion:
    """The version ``options`` names (``--version``, or the version under ``--alias``)."""
    model = registry.model(options.model)  # ModelNotFound names the model
    version = options.version
    if version is None:
        version = model.aliases.get(options.alias)
        if version is None:
            raise BatchError(
                f"model {options.model!r} has no version under alias {options.alias!r} "
                f"(its aliases: {model.aliases or 'none'}); pass --version"
            )
    source = registry.version_source(options.model, version)
    task = registry.version_task(options.model, version) or model.task
    return ServedVersion(options.model, str(version), task, source)


def prepare(options: JobOptions, registry: Registry) -> Planned:
    """Everything checked that can be before any work: the input's files and columns,
    the output's place, the version, its task's parameters; then the parts to do."""
    input_format = format_of(options.input, options.input_format or None)
    output_format = options.output_format or input_format
    format_of("." + output_format, output_format)  # a known one
    in_fs, in_path = filesystem(options.input)
    files = input_files(in_fs, in_path, input_format, options.input)
    check_columns(columns_of(in_fs, files[0], input_format), options.column,
                  options.query_column, files[0])  # fmt: skip
    out_fs, out_path = filesystem(options.output)
    done = written_parts(out_fs, out_path)
    try:
        served = resolve_version(registry, options)
    except ModelNotFound as exc:
        raise BatchError(exc.message) from None
    try:
        task = get_task(served.task)
    except ValueError as exc:
        raise BatchError(f"{served.name} version {served.version}: {exc}") from None
    check_task_options(task, options)
    parts = plan(in_fs, files, input_format, options.part_rows, options.part_bytes)
    todo = [p for p in parts if p.output_name(output_format) not in done]
    return Planned(served, input_format, output_format, parts, todo)


def actors_for(free: dict[str, float], parts: int, wanted: int | None) -> tuple[int, float, bool]:
    """``(actors, CPUs per actor, on GPUs)`` for a cluster with ``free`` resources
    (``ray.available_resources()``: a shared cluster's serving replicas keep theirs): one
    actor per free GPU where there are any, else one per free CPU, never more than there
    are parts (or ``wanted`` when given). Less than a CPU free: one actor on that share."""
    gpus = int(free.get("GPU", 0))
    cpus = float(free.get("CPU", 0.0))
    if cpus <= 0 and not gpus:
        raise BatchError("the Ray cluster has no free CPU or GPU for the job's actors")
    if gpus:
        actors = max(1, min(wanted or gpus, parts))
        return actors, max(cpus // actors, 0.0) or 0.0, True
    if cpus < 1:
        return 1, cpus, False
    actors = max(1, min(wanted or int(cpus), parts))
    # Fewer parts than CPUs: each actor's model gets the CPUs left over.
    return actors, float(max(1, int(cpus) // actors)), False


class Progress:
    """One line per finished part: rows, errors, rows/s and the time left."""

    def __init__(self, parts: list[Part], stream: TextIO = sys.stderr) -> None:
        self.total_weight = sum(p.weight for p in parts) or 1
        self.weights = {p.index: p.weight for p in parts}
        self.count = len(parts)
        self.stream = stream
        self.start = time.monotonic()
        self.done_weight = self.parts = self.rows = self.errors = 0

    def update(self, part: int, rows: int, errors: int) -> None:
        self.parts += 1
        self.rows += rows
        self.errors += errors
        self.done_weight += self.weights.get(part, 0)
        elapsed = max(time.monotonic() - self.start, 1e-9)
        share = self.done_weight / self.total_weight
        left = elapsed * (1 - share) / share if share else math.inf
        print(
            f"part {self.parts}/{self.count}: {self.rows:,} rows, {self.errors:,} errors, "
            f"{self.rows / elapsed:,.0f} rows/s, about {left:,.0f} s left",
            file=self.stream, flush=True,
        )  # fmt: skip


def run(
    options: JobOptions, registry: Registry, limits: Limits, *, quiet: bool = False
) -> dict[str, Any]:
    """Run the job; its figures. BatchError if a part failed (the others are written;
    a rerun does the rest)."""
    planned = prepare(options, registry)
    served = planned.served
    say = (lambda _: None) if quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    skipped = len(planned.parts) - len(planned.todo)
    say(f"{served.name} version {served.version} ({served.task}): {len(planned.parts)} parts"
        + (f", {skipped} already written" if skipped else ""))  # fmt: skip
    from infergate.batch.record import JobRecord

    record = JobRecord(registry, served, options)
    start = time.monotonic()
    figures = {"rows": 0, "errors": 0, "parts": len(planned.todo), "parts_failed": 0}
    try:
        if planned.todo:
            figures.update(_run_parts(options, planned, registry, limits, say, quiet))
    except BaseException:
        record.finish(figures, time.monotonic() - start, failed=True)
        raise
    duration = time.monotonic() - start
    figures["duration_s"] = duration
    figures["rows_per_s"] = figures["rows"] / duration if duration else 0.0
    record.finish(figures, duration, failed=bool(figures["parts_failed"]))
    figures["run_id"] = record.run_id
    if figures["parts_failed"]:
        raise BatchError(
            f"{figures['parts_failed']} of {len(planned.todo)} parts failed (see above); the "
            "others are written, and running the same command again does the rest"
        )
    return figures


def _run_parts(options: JobOptions, planned: Planned, registry: Registry, limits: Limits,
               say: Any, quiet: bool) -> dict[str, Any]:  # fmt: skip
    import ray

    address = os.environ.get("RAY_ADDRESS")
    # Our own instance unless told a cluster: never join another program's local Ray.
    # Ray starts its workers 15 steps nicer than the driver; on our own instance the
    # actors are the job, so they run at the driver's priority (as the stack's replicas).
    own = {} if address else {"_system_config": {"worker_niceness": 0}}
    try:
        ray.init(
            address=address or "local",
            include_dashboard=False,
            log_to_driver=not quiet,
            logging_level=logging.WARNING,
            runtime_env={"env_vars": WORKER_ENV},
            **own,
        )
    except (ConnectionError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BatchError(f"Ray did not start or could not be joined (RAY_ADDRESS="
                         f"{address or 'unset'}): {first}") from None  # fmt: skip
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # ours says rows/s and the time left
        ctx.print_on_execution_start = False
        free = ray.available_resources()
        actors, cpus, gpu = actors_for(free, len(planned.todo), options.concurrency)
        each = f"{cpus:g} CPUs each" + (", one GPU each" if gpu else "")
        say(f"{len(planned.todo)} parts to do on {actors} actors, {each}")
        spec = WorkerSpec(
            served=planned.served,
            tracking_uri=registry.tracking_uri,
            column=options.column,
            query_column=options.query_column,
            parameters=dict(options.parameters),
            batch_size=options.batch_size,
            input=options.input,
            output=options.output,
            output_format=planned.output_format,
            limits=limits,
            threads=max(1, int(cpus)),
            gpu=gpu,
        )
        items = [{"part": p.to_json()} for p in planned.todo]
        dataset = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            PartRunner,
            fn_constructor_kwargs={"spec": spec},
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=cpus,
            num_gpus=1 if gpu else 0,
        )
        progress = Progress(planned.todo, sys.stderr)
        if quiet:
            progress.stream = open(os.devnull, "w")  # noqa: SIM115
        failed = 0
        busy_s = 0.0  # the actors' seconds in parts, model loading aside
        for row in dataset.iter_rows():
            busy_s += float(row["seconds"])
            if row["failure"]:
                failed += 1
                print(f"part {row['part']} failed: {row['failure']}", file=sys.stderr, flush=True)
            progress.update(int(row["part"]), int(row["rows"]), int(row["errors"]))
        return {
            "rows": progress.rows,
            "errors": progress.errors,
            "parts_failed": failed,
            "actors": actors,
            # What the actors did once loaded: rows per second of part time, times actors.
            "busy_rows_per_s": progress.rows * actors / busy_s if busy_s else 0.0,
        }
    finally:
        ray.shutdown()
