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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
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
ACTORS_START_TIMEOUT_S = 600
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
    input_columns: list[str]  # the first file's


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
    columns = columns_of(in_fs, files[0], input_format)
    check_columns(columns, options.column, options.query_column, files[0])
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
    return Planned(served, input_format, output_format, parts, todo, columns)


def actors_for(
    free_by_node: Sequence[Mapping[str, float]], parts: int, wanted: int | None
) -> tuple[int, float, bool]:
    """``(actors, CPUs per actor, on GPUs)`` for a cluster whose live nodes have
    ``free_by_node`` resources free (a shared cluster's serving replicas keep theirs).

    With GPUs: one actor per free GPU. Else actors of one CPU, as many as the nodes hold
    whole CPUs; where no node has a whole CPU free, actors of the smallest free share, one
    per such share on each node. An actor fits on one node, so the count comes from each
    node's free CPUs, not their sum (two nodes with 0.4 free each take two actors of 0.4,
    never one of 0.8). Never more actors than parts (or ``wanted`` when given); with fewer
    actors than places, each takes whole multiples of the share while all still fit.
    """
    gpus = sum(int(node.get("GPU", 0)) for node in free_by_node)
    frees = [float(node.get("CPU", 0.0)) for node in free_by_node]
    frees = [cpus for cpus in frees if cpus > 0]
    if not frees and not gpus:
        raise BatchError("the Ray cluster has no free CPU or GPU for the job's actors")
    if gpus:
        actors = max(1, min(wanted or gpus, parts))
        return actors, max(sum(frees) // actors, 0.0) or 0.0, True
    unit = 1.0 if max(frees) >= 1 else min(frees)

    def places(share: float) -> int:
        return sum(int(cpus / share + 1e-6) for cpus in frees)

    actors = max(1, min(wanted or places(unit), parts, places(unit)))
    share = unit
    while places(share + unit) >= actors:
        share += unit
    return actors, round(share, 4), False


@dataclass
class StartUp:
    """When the job's work began and ended against its fixed costs: Ray's start, then the
    actors' loading of the version (in parallel), before the first part."""

    began: float  # the driver's wall clock at the job's start (before Ray's)
    ray_start_s: float = 0.0
    loads: dict[str, float] = field(default_factory=dict)  # actor -> seconds to load
    first: float = math.inf  # the first part's start, wall clock
    last: float = 0.0  # the last part's end

    def part(self, actor: str, load_s: float, began: float, ended: float) -> None:
        self.loads[actor] = load_s
        self.first, self.last = min(self.first, began), max(self.last, ended)

    def figures(self, rows: int) -> dict[str, float]:
        work_s = max(self.last - self.first, 0.0) if self.loads else 0.0
        return {
            "ray_start_s": self.ray_start_s,
            "load_s": max(self.loads.values(), default=0.0),  # the slowest actor's
            "startup_s": max(self.first - self.began, 0.0) if self.loads else 0.0,
            "work_s": work_s,
            # From the first part's start to the last one's end: the rate once started.
            "work_rows_per_s": rows / work_s if work_s else 0.0,
        }


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
    figures: dict[str, Any] = {
        "rows": 0, "errors": 0, "parts": len(planned.todo), "parts_failed": 0
    }  # fmt: skip
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

    startup = StartUp(began=time.time())
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
    startup.ray_start_s = time.time() - startup.began
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # ours says rows/s and the time left
        ctx.print_on_execution_start = False
        # Parts go out once the whole pool has loaded the version: an actor that starts
        # first would otherwise queue up every part while the others still load (seen
        # on a two-node cluster: all five parts on one node). A cluster that cannot place
        # the pool fails the job after this long, instead of it waiting for ever.
        ctx.wait_for_min_actors_s = ACTORS_START_TIMEOUT_S
        free = list(ray._private.state.available_resources_per_node().values())
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
            input_columns=tuple(planned.input_columns),
            threads=max(1, int(cpus)),
            gpu=gpu,
        )
        items = [{"part": p.to_json()} for p in planned.todo]
        dataset = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            PartRunner,
            fn_constructor_kwargs={"spec": spec},
            batch_size=1,
            # A part is seconds of work: one at a time per actor, so none waits queued
            # behind a busy actor while another is free.
            compute=ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=1),
            num_cpus=cpus,
            num_gpus=1 if gpu else 0,
        )
        progress = Progress(planned.todo, sys.stderr)
        if quiet:
            progress.stream = open(os.devnull, "w")  # noqa: SIM115
        failed = 0
        busy_s = 0.0  # the actors' seconds in parts, model loading aside
        cpu_s = 0.0  # their CPU seconds in parts
        waited_s = 0.0  # their seconds in parts ready to run but waiting for a CPU
        rows_by_node: dict[str, int] = {}  # where the parts ran: the node's address
        rows = dataset.iter_rows()
        for row in _started(rows, actors, each):
            busy_s += float(row["seconds"])
            cpu_s += float(row["cpu_s"])
            waited_s += float(row["waited_s"])
            rows_by_node[row["node"]] = rows_by_node.get(row["node"], 0) + int(row["rows"])
            startup.part(str(row["actor"]), float(row["load_s"]), float(row["began"]),
                         float(row["ended"]))  # fmt: skip
            if row["failure"]:
                failed += 1
                print(f"part {row['part']} failed: {row['failure']}", file=sys.stderr, flush=True)
            progress.update(int(row["part"]), int(row["rows"]), int(row["errors"]))
        return {
            "rows": progress.rows,
            "errors": progress.errors,
            "parts_failed": failed,
            "actors": actors,
            "nodes": len(rows_by_node),
            "rows_by_node": dict(sorted(rows_by_node.items())),
            # What the actors did once loaded: rows per second of part time, times actors.
            "busy_rows_per_s": progress.rows * actors / busy_s if busy_s else 0.0,
            # Their CPU per row in parts: what other load on the machine moves least.
            "busy_cpu_ms_per_row": 1e3 * cpu_s / progress.rows if progress.rows else 0.0,
            # The share of that time they waited for a CPU: the machine's other work.
            "busy_waited_share": waited_s / busy_s if busy_s else 0.0,
            **startup.figures(progress.rows),
        }
    finally:
        ray.shutdown()


def _started(rows: Iterator[dict[str, Any]], actors: int, each: str) -> Iterator[dict[str, Any]]:
    """``rows``, with Ray Data's timeout for starting the actor pool as a BatchError."""
    import ray

    try:
        yield from rows
    except ray.exceptions.GetTimeoutError:
        raise BatchError(
            f"the Ray cluster did not start the job's {actors} actors ({each}) within "
            f"{ACTORS_START_TIMEOUT_S} s: too few free resources, or loading the version "
            "failed on the nodes (see Ray's logs); set --concurrency to ask for fewer"
        ) from None
