"""The job's files through pyarrow's filesystems: the input split into parts, each part
read in chunks, and one output file per part written under a name fixed by the part.

A part is a run of Parquet row groups, a byte range of a JSON Lines file (the lines that
start in it), or a byte range of a CSV file cut at record boundaries (csv_parts.py: a
quoted field may hold a line break, so not every line end is one). Output part
``part-00003.parquet`` is written beside under a temporary name and renamed when whole: a
rerun finds it and skips part 3. A part with no rows (a header-only CSV file, an empty
JSON Lines file) leaves an empty ``_part-00003.parquet.empty`` instead: an empty file is
no valid Parquet file, and data readers pass by names that start with ``_``.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from infergate.batch.csv_parts import Chunk, csv_columns, csv_file_ranges, read_csv_part
from infergate.batch.options import FORMATS
from infergate.errors import BatchError

PART_PREFIX = "part-"
EMPTY_PREFIX, EMPTY_SUFFIX = "_", ".empty"  # around a part's name: the part has no rows
SCAN_BYTES = 1 << 16  # read this much at a time looking for a line end
SCHEMA_SAMPLE_BYTES = 1 << 20  # the JSON Lines read to find the columns
BAD_LINE = "__bad_line__"  # a JSON Lines chunk's column: why a line could not be read
# An output Parquet file's row groups: chunks (a model call's rows each) are gathered up to
# this many rows or bytes before a row group is written. A row group per chunk of 32 rows
# wrote 2,048 row groups for 65,536 rows, each with its own statistics and pages.
ROW_GROUP_ROWS = 8192
ROW_GROUP_BYTES = 32 << 20


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a local path or a URL (``s3://``, ``gs://``, ``hdfs://``,
    ``file://``...)."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), posixpath.abspath(uri)
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise BatchError(f"cannot open {uri!r}: {exc}") from None


@dataclass(frozen=True)
class Part:
    """One unit of work: which rows of which input file; ``weight`` (rows or bytes) is its
    share of the job for the progress line."""

    index: int
    path: str
    format: str
    row_groups: tuple[int, ...] = ()  # Parquet
    # JSON Lines: the byte range whose lines are this part's; CSV: its records' bytes.
    start: int = 0
    stop: int = 0
    weight: int = 0
    columns: tuple[str, ...] = ()  # CSV: the header's names, for a file that is split

    def output_name(self, output_format: str) -> str:
        return f"{PART_PREFIX}{self.index:05d}{FORMATS[output_format][0]}"

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> Part:
        data = json.loads(text)
        return cls(**{**data, "row_groups": tuple(data["row_groups"]),
                      "columns": tuple(data["columns"])})  # fmt: skip


def input_files(fs: pafs.FileSystem, path: str, fmt: str, shown: str) -> list[str]:
    """``path`` if it is a file, else the files of that format in the folder, sorted."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [path]
    if info.type != pafs.FileType.Directory:
        raise BatchError(f"INPUT {shown!r} does not exist")
    selector = pafs.FileSelector(path, recursive=True)
    found = sorted(
        i.path for i in fs.get_file_info(selector)
        if i.type == pafs.FileType.File and i.path.lower().endswith(FORMATS[fmt])
        and not posixpath.basename(i.path).startswith((".", "_"))
    )  # fmt: skip
    if not found:
        raise BatchError(f"INPUT {shown!r} is a folder with no {fmt} files in it")
    return found


def columns_of(fs: pafs.FileSystem, path: str, fmt: str) -> list[str]:
    """The column names of one input file, reading as little as it takes; BatchError,
    one line, for a file that is not of its format."""
    try:
        if fmt == "parquet":
            with fs.open_input_file(path) as f:
                return list(pq.ParquetFile(f).schema_arrow.names)
        if fmt == "csv":
            return csv_columns(fs, path)
        with fs.open_input_file(path) as f:
            head = f.read(SCHEMA_SAMPLE_BYTES)
        lines = head.splitlines()
        if len(head) == SCHEMA_SAMPLE_BYTES and len(lines) > 1:
            lines = lines[:-1]  # the last one may be cut
        names: dict[str, None] = {}
        for number, line in enumerate(lines, 1):
            if line.strip():
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError(f"line {number} is not a JSON object")
                names.update(dict.fromkeys(row))
        return list(names)
    except (pa.ArrowException, ValueError, OSError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BatchError(f"{path} is not a readable {fmt} file: {detail}") from None


def plan(fs: pafs.FileSystem, files: list[str], fmt: str, part_rows: int,
         part_bytes: int) -> list[Part]:  # fmt: skip
    """The job's parts, numbered in order over ``files``: the same input gives the same
    parts, which is what lets a rerun skip the ones already written."""
    parts: list[Part] = []
    for path in files:
        if fmt == "parquet":
            with fs.open_input_file(path) as f:
                metadata = pq.ParquetFile(f).metadata
            groups: list[int] = []
            rows = 0
            for group in range(metadata.num_row_groups):
                groups.append(group)
                rows += metadata.row_group(group).num_rows
                if rows >= part_rows or group == metadata.num_row_groups - 1:
                    parts.append(Part(len(parts), path, fmt, tuple(groups), weight=rows))
                    groups, rows = [], 0
        elif fmt == "jsonl":
            size = fs.get_file_info(path).size or 0
            for start in range(0, max(size, 1), part_bytes):
                stop = min(start + part_bytes, size)
                parts.append(Part(len(parts), path, fmt, start=start, stop=stop,
                                  weight=stop - start))  # fmt: skip
        else:
            try:
                ranges = csv_file_ranges(fs, path, part_bytes)
            except (pa.ArrowException, OSError) as exc:
                detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise BatchError(f"{path} is not a readable csv file: {detail}") from None
            for start, stop, columns in ranges:
                parts.append(Part(len(parts), path, fmt, start=start, stop=stop,
                                  weight=stop - start, columns=tuple(columns)))  # fmt: skip
    return parts


def written_parts(fs: pafs.FileSystem, output: str) -> set[str]:
    """The names of the parts already written in ``output``: their files, and the marks of
    those with no rows."""
    info = fs.get_file_info(output)
    if info.type == pafs.FileType.NotFound:
        return set()
    if info.type != pafs.FileType.Directory:
        raise BatchError(f"OUTPUT {output!r} is a file; give a folder for the part files")
    names = {posixpath.basename(i.path) for i in fs.get_file_info(pafs.FileSelector(output))}
    empty = EMPTY_PREFIX + PART_PREFIX
    return {name.removeprefix(EMPTY_PREFIX).removesuffix(EMPTY_SUFFIX) for name in names
            if name.startswith(PART_PREFIX)
            or (name.startswith(empty) and name.endswith(EMPTY_SUFFIX))}  # fmt: skip


# -- reading a part ------------------------------------------------------------------------


def read_part(fs: pafs.FileSystem, part: Part, rows: int) -> Iterator[Chunk]:
    """``part``'s rows in chunks of up to ``rows``, as Python values (a text column may
    hold anything: a row that is not a string gets an error, not the job)."""
    if part.format == "parquet":
        with fs.open_input_file(part.path) as f:
            batches = pq.ParquetFile(f).iter_batches(batch_size=rows, row_groups=part.row_groups)
            for batch in batches:
                yield batch.to_pydict()
    elif part.format == "csv":
        yield from read_csv_part(fs, part.path, part.start, part.stop, list(part.columns), rows)
    else:
        yield from _json_lines(fs, part, rows)


def _json_lines(fs: pafs.FileSystem, part: Part, rows: int) -> Iterator[Chunk]:
    with fs.open_input_file(part.path) as f:
        size = f.size()
        begin = _line_start(f, part.start, size)
        end = _line_start(f, part.stop, size)
        data = f.read_at(end - begin, begin) if end > begin else b""
    # Every chunk gets every column of the part (a first pass reads the names only), so a
    # column first seen in a later line is in a CSV part's header and a Parquet part's
    # schema too, not only in the lines that hold it.
    names: dict[str, None] = {}
    for record in _records(data):
        names.update(dict.fromkeys(record))
    records: list[dict[str, Any]] = []
    for record in _records(data):
        records.append(record)
        if len(records) == rows:
            yield _columns(records, names)
            records = []
    if records:
        yield _columns(records, names)


def _records(data: bytes) -> Iterator[dict[str, Any]]:
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            record = {BAD_LINE: f"the line is not JSON: {exc}"}
        if not isinstance(record, dict):
            record = {BAD_LINE: "the line is not a JSON object"}
        yield record


def _line_start(f: Any, at: int, size: int) -> int:
    """The first line start at or after byte ``at``."""
    if at <= 0:
        return 0
    if at >= size:
        return size
    position = at - 1
    while position < size:
        chunk = f.read_at(min(SCAN_BYTES, size - position), position)
        newline = chunk.find(b"\n")
        if newline >= 0:
            return position + newline + 1
        position += len(chunk)
    return size


def _columns(records: list[dict[str, Any]], names: dict[str, None]) -> Chunk:
    return {name: [record.get(name) for record in records] for name in names}


# -- writing a part ------------------------------------------------------------------------


class PartWriter:
    """Writes one output part chunk by chunk, under a temporary name until ``commit``."""

    def __init__(
        self,
        fs: pafs.FileSystem,
        output: str,
        name: str,
        fmt: str,
        types: dict[str, pa.DataType] | None = None,
    ) -> None:
        self._fs, self._fmt = fs, fmt
        self.path = posixpath.join(output, name)
        self._temporary = posixpath.join(output, f".{name}.writing")
        self._empty_mark = posixpath.join(output, EMPTY_PREFIX + name + EMPTY_SUFFIX)
        self._rows = 0
        fs.create_dir(output, recursive=True)
        self._stream = fs.open_output_stream(self._temporary)
        self._parquet: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []  # Parquet chunks before a schema is settled
        self._gathered: list[pa.Table] = []  # conformed chunks of the next row group
        self._csv_header: list[str] | None = None
        # Columns whose type is known beforehand (the error column, null in most rows):
        # every part's file gets the same type, whatever its rows held.
        self._types = types or {}

    def write(self, chunk: Chunk) -> None:
        self._rows += _length(chunk)
        if self._fmt == "jsonl":
            names = list(chunk)
            lines = (
                json.dumps(dict(zip(names, values, strict=True)), ensure_ascii=False,
                           default=str) + "\n"
                for values in zip(*chunk.values(), strict=True)
            )  # fmt: skip
            self._stream.write("".join(lines).encode())
        elif self._fmt == "csv":
            self._write_csv(chunk)
        else:
            self._write_parquet(_table(chunk, self._types))

    def _write_csv(self, chunk: Chunk) -> None:
        buffer = io.StringIO()
        out = csv.writer(buffer)
        if self._csv_header is None:
            self._csv_header = list(chunk)
            out.writerow(self._csv_header)
        for values in zip(*(chunk.get(n, [None] * _length(chunk)) for n in self._csv_header),
                          strict=True):  # fmt: skip
            out.writerow(["" if v is None else _cell(v) for v in values])
        self._stream.write(buffer.getvalue().encode())

    def _write_parquet(self, table: pa.Table) -> None:
        if self._parquet is None:
            # A chunk whose column is all null (or all empty lists) says nothing of its
            # type: wait for one that does (or the part's end: a part is bounded) before
            # fixing the file's schema.
            self._pending.append(table)
            if not all(settled(t) for t in table.schema.types):
                return
            self._open_parquet()
            return
        self._gather(_conform(table, self._parquet.schema))

    def _open_parquet(self) -> None:
        schema = pa.unify_schemas([t.schema for t in self._pending], promote_options="permissive")
        self._parquet = pq.ParquetWriter(self._stream, schema)
        for table in self._pending:
            self._gather(_conform(table, schema))
        self._pending = []

    def _gather(self, table: pa.Table) -> None:
        self._gathered.append(table)
        rows = sum(t.num_rows for t in self._gathered)
        if rows >= ROW_GROUP_ROWS or sum(t.nbytes for t in self._gathered) >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._gathered and self._parquet is not None:
            table = pa.concat_tables(self._gathered)
            self._parquet.write_table(table, row_group_size=table.num_rows)  # one row group
        self._gathered = []

    def commit(self) -> None:
        if not self._rows:  # no file at all rather than one no reader takes
            self.abort()
            self._fs.open_output_stream(self._empty_mark).close()
            return
        if self._fmt == "parquet":
            if self._parquet is None and self._pending:
                self._open_parquet()
            if self._parquet is not None:
                self._flush()
                self._parquet.close()
        self._stream.close()
        self._fs.move(self._temporary, self.path)

    def abort(self) -> None:
        try:
            if self._parquet is not None:
                self._parquet.close()
            self._stream.close()
            self._fs.delete_file(self._temporary)
        except OSError:
            pass


def settled(kind: pa.DataType) -> bool:
    """Whether ``kind`` says what its values are: no null type in it, at any depth (a
    list of no entities is ``list<null>``)."""
    if pa.types.is_null(kind):
        return False
    return all(settled(kind.field(i).type) for i in range(kind.num_fields))


def _length(chunk: Chunk) -> int:
    return len(next(iter(chunk.values()), []))


def _cell(value: Any) -> Any:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else value


def _table(chunk: Chunk, types: dict[str, pa.DataType]) -> pa.Table:
    """``chunk`` as a table, ``types`` the types of some columns; a column of mixed types
    (JSON Lines) is kept as JSON text."""
    arrays = {}
    for name, values in chunk.items():
        try:
            arrays[name] = pa.array(values, type=types.get(name))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            arrays[name] = pa.array(
                [None if v is None else json.dumps(v, default=str) for v in values]
            )
    return pa.table(arrays)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = [
        table.column(f.name).cast(f.type) if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]  # fmt: skip
    return pa.Table.from_arrays(columns, schema=schema)
