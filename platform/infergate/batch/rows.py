"""One chunk of rows: which texts can be answered, and the columns the answers add.

Pure: a bad row (not a string, blank, over the front-end's character limit, or a blank
query) gets the message predict would have answered in its ``error`` column, and the
others are answered; nothing about one row stops the job.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infergate.errors import InfergateError
from infergate.protocols.wire import Limits, check_texts
from infergate.tasks import Task

VERSION_COLUMN = "version"
ERROR_COLUMN = "error"
RENAMED_PREFIX = "infergate_"


def added_name(key: str, input_columns: Collection[str]) -> str:
    """The name a column the job adds is written under: its own, or with ``infergate_``
    in front where the input has a column of that name (a data set's own ``label`` stays,
    beside the answer's ``infergate_label``)."""
    while key in input_columns:
        key = RENAMED_PREFIX + key
    return key


def row_problem(text: Any, limits: Limits, what: str = "the text") -> str | None:
    """Why predict would refuse ``text``, or None."""
    try:
        check_texts([text], limits, what, lambda _: what)
    except InfergateError as exc:
        return exc.message
    return None


@dataclass(frozen=True)
class Checked:
    """A chunk's rows split into those to answer and those refused."""

    texts: list[str]  # of the rows to answer, in order
    queries: list[str] | None  # one per text in ``texts`` with a query column
    answered: list[int]  # their positions in the chunk
    errors: dict[int, str]  # position -> why the row was refused


def check_rows(
    texts: Sequence[Any],
    queries: Sequence[Any] | None,
    limits: Limits,
    known: Sequence[str | None] | None = None,
) -> Checked:
    """Split a chunk's ``texts`` (and per-row ``queries``) into good and refused rows;
    ``known``: problems found while reading (a JSON line that is not an object)."""
    good: list[str] = []
    good_queries: list[str] = []
    answered: list[int] = []
    errors: dict[int, str] = {}
    for index, text in enumerate(texts):
        problem = known[index] if known is not None else None
        if problem is None:
            problem = row_problem(text, limits)
        if problem is None and queries is not None:
            problem = row_problem(queries[index], limits, "the query")
        if problem is not None:
            errors[index] = problem
            continue
        good.append(text)
        answered.append(index)
        if queries is not None:
            good_queries.append(queries[index])
    return Checked(good, good_queries if queries is not None else None, answered, errors)


def plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars turned into lists and Python numbers."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def answer_columns(task: Task, outputs: Sequence[Any]) -> dict[str, list[Any]]:
    """The columns of ``outputs`` (one answer per text): an object's keys, or the task's
    ``batch_column`` for any other answer."""
    columns: dict[str, list[Any]] = {}
    for position, output in enumerate(outputs):
        fields = dict(output) if isinstance(output, Mapping) else {task.batch_column: output}
        for key, value in fields.items():
            columns.setdefault(key, [None] * len(outputs))[position] = plain(value)
    return columns


def result_columns(
    task: Task, rows: int, checked: Checked, outputs: Sequence[Any], version: str,
    failure: str | None = None, answer_keys: Iterable[str] = (),
) -> dict[str, list[Any]]:  # fmt: skip
    """What a chunk of ``rows`` rows adds: the answers' columns (None where a row has none;
    every one of ``answer_keys`` even when no row has an answer), the version, and each
    row's error (``failure`` for every answered row when the model failed on the chunk)."""
    columns: dict[str, list[Any]] = {key: [None] * rows for key in answer_keys}
    if failure is None:
        for key, values in answer_columns(task, outputs).items():
            column = columns.setdefault(key, [None] * rows)
            for position, value in zip(checked.answered, values, strict=True):
                column[position] = value
    errors: list[str | None] = [checked.errors.get(i) for i in range(rows)]
    if failure is not None:
        for position in checked.answered:
            errors[position] = failure
    columns[VERSION_COLUMN] = [version] * rows
    columns[ERROR_COLUMN] = errors
    return columns
