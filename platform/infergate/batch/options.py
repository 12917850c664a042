"""What an ``infergate batch`` job is asked to do, checked before any work starts.

Pure: no Ray, pyarrow or MLflow. Every mistake is one line that says what was given and
what to give instead (``BatchError``, exit code 1).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infergate.errors import BatchError, InfergateError
from infergate.protocols.wire import PARAMETERS, check_parameters
from infergate.tasks import Task
from infergate.versions import CANARY, CHAMPION

# Format name -> the file name endings that mean it.
FORMATS: dict[str, tuple[str, ...]] = {
    "parquet": (".parquet", ".pq"),
    "jsonl": (".jsonl", ".ndjson", ".json"),
    "csv": (".csv",),
}
ALIASES = (CHAMPION, CANARY)
DEFAULT_BATCH_SIZE = 32
MAX_BATCH_SIZE = 1024
DEFAULT_PART_ROWS = 8192  # Parquet row groups are gathered into parts of about this many rows
DEFAULT_PART_BYTES = 8 << 20  # JSON Lines and CSV files are split into parts of about this size


@dataclass(frozen=True)
class JobOptions:
    """One job, as the command line gave it."""

    model: str
    input: str  # a file or a folder of them: a local path or a URL pyarrow's filesystems take
    output: str  # a folder of part files, made if missing
    column: str = "text"
    version: str | None = None  # None: the version under ``alias``
    alias: str = CHAMPION
    query_column: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    batch_size: int = DEFAULT_BATCH_SIZE
    input_format: str = ""
    output_format: str = ""
    part_rows: int = DEFAULT_PART_ROWS
    part_bytes: int = DEFAULT_PART_BYTES
    concurrency: int | None = None  # actors; None: sized from the cluster's resources


def format_of(path: str, given: str | None = None) -> str:
    """``given``, or the format ``path``'s ending names; BatchError if neither says."""
    if given:
        if given not in FORMATS:
            raise BatchError(f"format {given!r} is not supported; use one of {list(FORMATS)}")
        return given
    lowered = path.lower().rstrip("/")
    for name, endings in FORMATS.items():
        if lowered.endswith(endings):
            return name
    known = ", ".join(e for es in FORMATS.values() for e in es)
    raise BatchError(
        f"cannot tell the format of {path!r} from its name (expected one of {known}); "
        "pass --input-format or --output-format"
    )


def parse_parameters(text: str | None) -> dict[str, Any]:
    """The ``--parameters`` JSON object, checked as predict's ``parameters`` are."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BatchError(f"--parameters is not JSON ({exc}); give an object such as "
                         '\'{"normalize": false}\'') from None  # fmt: skip
    try:
        return check_parameters(value, PARAMETERS)
    except InfergateError as exc:
        raise BatchError(f"--parameters: {exc.message}") from None


def check_batch_size(batch_size: int) -> int:
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise BatchError(f"--batch-size is {batch_size}; use 1 to {MAX_BATCH_SIZE}")
    return batch_size


def check_alias(alias: str) -> str:
    if alias not in ALIASES:
        raise BatchError(f"--alias is {alias!r}; use one of {list(ALIASES)} (or --version)")
    return alias


def check_columns(names: Sequence[str], column: str, query_column: str | None, source: str) -> None:
    """The text column (and the query column) are among the input's ``names``."""
    for flag, wanted in (("--column", column), ("--query-column", query_column)):
        if wanted is not None and wanted not in names:
            raise BatchError(
                f"{source} has no column {wanted!r} ({flag}); its columns are {list(names)}"
            )


def check_task_options(task: Task, options: JobOptions) -> None:
    """The parameters and query column suit the version's task (as predict checks them)."""
    parameters = dict(options.parameters)
    row_parameter = task.row_parameter
    if options.query_column is not None:
        if row_parameter is None:
            raise BatchError(
                f"--query-column applies to models that score (query, text) pairs; "
                f"{options.model!r} is a {task.name} model"
            )
        if row_parameter in parameters:
            raise BatchError(
                f"--query-column and parameter {row_parameter!r} both give the "
                f"{row_parameter}; give one"
            )
        parameters[row_parameter] = [task.probe_parameters[row_parameter]]
    try:
        task.check_parameters(parameters, options.model)
    except InfergateError as exc:
        hint = (
            f" (or --query-column for one {row_parameter} per row)"
            if row_parameter and row_parameter not in parameters
            else ""
        )
        raise BatchError(exc.message + hint) from None
