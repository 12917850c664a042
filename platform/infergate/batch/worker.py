"""The Ray Data actor of a batch job: loads the version once, then runs whole parts.

Each call gets one part (``map_batches(..., batch_size=1)``), reads it in chunks, answers
each chunk through the serving path's ``ModelRuntime.predict`` and writes the part's
output file; it returns the part's figures for the driver's progress line and record, with
when the part began and ended and how long the actor took to load the version, so that the
job can tell its start-up apart from its work.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from infergate.batch.files import (
    BAD_LINE,
    Chunk,
    Part,
    PartWriter,
    filesystem,
    read_part,
    settled,
)
from infergate.batch.rows import (
    ERROR_COLUMN,
    VERSION_COLUMN,
    Checked,
    added_name,
    answer_columns,
    check_rows,
    result_columns,
)
from infergate.errors import InfergateError
from infergate.protocols.wire import Limits
from infergate.serving.tokenization import tokenize_serially
from infergate.versions import ServedVersion

log = logging.getLogger(__name__)
PROBE_TEXT = "a short probe text"  # answered once per actor: the answer's columns


@dataclass(frozen=True)
class WorkerSpec:
    """What every actor of one job needs (pickled to them by Ray)."""

    served: ServedVersion
    tracking_uri: str
    column: str
    query_column: str | None
    parameters: dict[str, Any]
    batch_size: int
    input: str  # the job's INPUT, for its filesystem
    output: str
    output_format: str
    limits: Limits
    # The input's columns (its first file's): a column the job adds under one of these
    # names is renamed (rows.added_name), never written over the input's.
    input_columns: tuple[str, ...] = ()
    threads: int = 1  # the model's threads in each actor: the CPUs it was given
    gpu: bool = False
    # Each node keeps its copy of the version's files here.
    cache_dir: str = field(
        default_factory=lambda: str(Path(tempfile.gettempdir()) / "infergate-batch")
    )


def arrow_type(values: list[Any]) -> pa.DataType | None:
    """The Arrow type of a column of ``values``; None where they leave it open (an empty
    list of entities, mixed types)."""
    try:
        kind = pa.array(values).type
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    return kind if settled(kind) else None


def waited_s() -> float:
    """Seconds this thread has waited, ready to run, for a CPU (Linux's schedstat; 0.0
    where there is none): how much of a part's time other work on the machine took."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def node_address() -> str:
    """The address of the Ray node this actor runs on ("local" outside Ray)."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "local"


class PartRunner:
    """One actor: the version loaded, then parts in turn."""

    def __init__(self, spec: WorkerSpec) -> None:
        from infergate.batch.engines import load
        from infergate.registry import Registry

        began = time.perf_counter()
        tokenize_serially()  # the actor's CPUs are the model's; one thread tokenizes
        self.spec = spec
        registry = Registry(spec.tracking_uri)
        self.runtime, self.backend = load(
            spec.served, registry, Path(spec.cache_dir), threads=spec.threads, gpu=spec.gpu
        )
        self.task = self.runtime.task
        self.loop = asyncio.new_event_loop()
        self.input_fs, _ = filesystem(spec.input)
        self.fs, self.output = filesystem(spec.output)
        self.node = node_address()
        self.actor = f"{self.node}/{os.getpid()}"
        self.answer_types = self.probe()
        # The version's files, the session and the probe's answer: all before any part.
        self.load_s = time.perf_counter() - began

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        figures: dict[str, list[Any]] = {
            "part": [], "rows": [], "errors": [], "seconds": [], "failure": [], "node": [],
            "actor": [], "load_s": [], "began": [], "ended": [], "cpu_s": [], "waited_s": [],
        }  # fmt: skip
        for text in batch["part"]:
            part = Part.from_json(str(text))
            began = time.time()  # the wall clock: the driver compares it with its own
            start, cpu, waited = time.perf_counter(), time.process_time(), waited_s()
            try:
                rows, errors = self.run_part(part)
                failure = ""
            except Exception as exc:  # the part's file: unreadable, or the output unwritable
                log.warning("part %d failed: %s", part.index, exc)
                rows, errors, failure = 0, 0, f"{type(exc).__name__}: {exc}"
            figures["part"].append(part.index)
            figures["rows"].append(rows)
            figures["errors"].append(errors)
            figures["seconds"].append(time.perf_counter() - start)
            figures["failure"].append(failure)
            figures["node"].append(self.node)
            figures["actor"].append(self.actor)
            figures["load_s"].append(self.load_s)
            figures["began"].append(began)
            figures["ended"].append(time.time())
            # The actor's CPU on the part: steadier than its seconds on a busy machine.
            figures["cpu_s"].append(time.process_time() - cpu)
            figures["waited_s"].append(waited_s() - waited)
        return figures

    def probe(self) -> dict[str, pa.DataType | None]:
        """The columns an answer adds, in order, each with its Arrow type (None where the
        probe's answer leaves it open: an empty list of entities). Every part's file gets
        them all, so that a chunk or a part with no answer (every row refused) does not fix
        a CSV header or Parquet schema without them, and has them typed where the probe's
        answer tells the type."""
        queries = None if self.spec.query_column is None else [PROBE_TEXT]
        probe = Checked([PROBE_TEXT], queries, [0], {})
        outputs, failure = self.predict(probe, self.task.probe_parameters)
        if failure is not None:
            log.warning("the probe answer failed (%s); columns come from the answers", failure)
            return {}
        return {
            key: arrow_type(values) for key, values in answer_columns(self.task, outputs).items()
        }

    def run_part(self, part: Part) -> tuple[int, int]:
        """Answer one part into its output file: ``(rows, rows with an error)``."""
        name = part.output_name(self.spec.output_format)
        types = {k: t for k, t in self.answer_types.items() if t is not None}
        types |= {VERSION_COLUMN: pa.string(), ERROR_COLUMN: pa.string()}
        types = {self.added_name(k): t for k, t in types.items()}
        error = self.added_name(ERROR_COLUMN)
        writer = PartWriter(self.fs, self.output, name, self.spec.output_format, types)

        rows = errors = 0
        try:
            for chunk in read_part(self.input_fs, part, self.spec.batch_size):
                answered = self.answer(chunk)
                writer.write(answered)
                rows += len(answered[error])
                errors += sum(e is not None for e in answered[error])
        except BaseException:
            writer.abort()
            raise
        writer.commit()
        return rows, errors

    def answer(self, chunk: Chunk) -> Chunk:
        """The chunk's columns, then the answers' columns, the version and the error."""
        known = chunk.pop(BAD_LINE, None)  # JSON Lines that could not be read
        n = len(next(iter(chunk.values()), known or []))
        texts = chunk.get(self.spec.column, [None] * n)
        queries = None
        if self.spec.query_column is not None:
            queries = chunk.get(self.spec.query_column, [None] * n)
        checked = check_rows(texts, queries, self.spec.limits, known)
        outputs, failure = self.predict(checked)
        if failure is not None and len(checked.texts) > 1:
            # As Triton's model does: the chunk failed, so each row alone, to find the rows
            # at fault and answer the others.
            return self._row_by_row(chunk, checked, n)
        added = result_columns(
            self.task, n, checked, outputs, self.spec.served.version, failure, self.answer_types
        )
        return self._merged(chunk, added)

    def _row_by_row(self, chunk: Chunk, checked: Checked, n: int) -> Chunk:
        parts = []
        for k, position in enumerate(checked.answered):
            queries = None if checked.queries is None else [checked.queries[k]]
            one = Checked([checked.texts[k]], queries, [position], {})
            parts.append((one, *self.predict(one)))
        errors = dict(checked.errors)
        outputs: list[Any] = []
        answered: list[int] = []
        texts: list[str] = []
        for one, output, failure in parts:
            if failure is None:
                outputs.extend(output)
                answered.extend(one.answered)
                texts.extend(one.texts)
            else:
                errors[one.answered[0]] = failure
        merged = Checked(texts, None, answered, errors)
        added = result_columns(
            self.task, n, merged, outputs, self.spec.served.version, answer_keys=self.answer_types
        )
        return self._merged(chunk, added)

    def added_name(self, key: str) -> str:
        return added_name(key, self.spec.input_columns)

    def _merged(self, chunk: Chunk, added: Chunk) -> Chunk:
        """The chunk's columns, then those the job adds, renamed where the input has one
        of their names."""
        return {**chunk, **{self.added_name(key): values for key, values in added.items()}}

    def predict(
        self, checked: Checked, extra: Mapping[str, Any] | None = None
    ) -> tuple[list[Any], str | None]:
        """The answers to ``checked``'s texts (with the job's parameters, ``extra`` over
        them), or why the model failed on them."""
        if not checked.texts:
            return [], None
        parameters = {**self.spec.parameters, **(extra or {})}
        if checked.queries is not None and self.task.row_parameter is not None:
            parameters[self.task.row_parameter] = checked.queries
        try:
            prediction = self.loop.run_until_complete(
                self.runtime.predict(checked.texts, parameters, self.backend)
            )
        except InfergateError as exc:
            return [], exc.message
        except Exception as exc:  # the engine's own errors (ONNX Runtime, CTranslate2)
            log.warning("the model failed on %d rows: %s", len(checked.texts), exc)
            return [], f"the model failed on this row: {type(exc).__name__}: {exc}"
        return list(prediction.outputs), None
