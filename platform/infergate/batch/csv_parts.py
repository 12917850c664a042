"""A CSV file cut into parts at record boundaries, and a part's rows read through pyarrow.

A quoted field may hold a line break, so a line end is not always a record's end. In
standard CSV (RFC 4180: fields quoted with ``"``, a quote inside a field doubled) it is
one exactly when the number of ``"`` bytes before it in the file is even
(https://www.rfc-editor.org/rfc/rfc4180#section-2). The planner reads the file once, in
blocks, counting quotes and looking for line ends with ``bytes.find`` only near the
places it wants to cut, so a large file costs a pass at memory speed and one block of
memory.

That parity is a record's state only where every quote stands where RFC 4180 puts one.
With ``q`` the number of quotes before a quote, one at even ``q`` opens a field or is the
second of a doubled pair, so it follows the file's start (after any BOM), a ``,``, a line
end (LF or CR) or a quote; one at odd ``q`` closes a field or is the first of a doubled
pair, so it is followed by a ``,``, a line end, the file's end or a quote.
Anywhere else (``5" screen``, ``a, "b"``, ``12",`` for inches, ``"a"b``) pyarrow keeps the
quote as text or reads on in its own way, and counting it would put every later cut out
of step: a file with one is not split. The planner checks every quote of every block with
numpy, at memory speed.

Each part is the exact byte range of its records. The first holds the header; the others
are read with the header's column names given, through the same pyarrow reading (every
column as text, ``CSV_PARSING``), so their rows are the rows pyarrow reads from the whole
file, in order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs

# A quoted CSV field may hold a line break: pyarrow reads a file in blocks cut at line
# ends, and without this a break inside a field near a block's end loses its sync.
CSV_PARSING = pacsv.ParseOptions(newlines_in_values=True)
SCAN_BLOCK_BYTES = 1 << 20  # the planner's read size
QUOTE, NEWLINE, CR = b'"', b"\n", b"\r"
LINE_ENDS = b"\r\n"
BOM = b"\xef\xbb\xbf"
# The bytes a quote at even q may follow and one at odd q may be followed by (besides the
# file's start and end): a field's edge, or the other quote of a doubled pair.
FIELD_EDGE = np.zeros(256, dtype=bool)
FIELD_EDGE[list(b',\r\n"')] = True

# The endings pyarrow's input streams decompress by (gzip, bz2, LZ4, Zstandard, Brotli): a
# compressed file is one part, read whole as a stream, since no byte of it can be cut to.
COMPRESSED = (".gz", ".bz2", ".lz4", ".zst", ".br")
Reader = Callable[[int, int], bytes]  # (offset, length) -> the file's bytes there
Chunk = dict[str, list[Any]]  # column name -> values


def record_cuts(read: Reader, size: int, part_bytes: int) -> tuple[list[int], int] | None:
    """Where the parts after the first start, and where the header record ends; ``None``
    for a file with a quote outside the standard (not to be split).

    Each cut is the first record start at least ``part_bytes`` after the previous one (the
    first: after byte 0) that ends a part with a non-empty record, and past the header, so
    every part holds a data row; a cut with only line ends after it is none.
    """
    cuts: list[int] = []
    header_end = -1
    seek = 0  # the first line end (an offset in the file) that may end a part
    quotes = 0  # quotes before the block
    tail = b""  # the previous block's last two bytes, for what spans two blocks
    grammar = _QuoteGrammar()
    position = 0
    content_start = 0  # where the file's content starts (after a BOM), for blank lines
    content_end = 0  # the end of the file's last byte that is not a line end
    while position < size:
        # The first block holds any BOM whole (pyarrow skips it, so the grammar does).
        block = read(position, min(max(SCAN_BLOCK_BYTES, len(BOM)), size - position))
        if not block:
            break
        found = grammar.quotes(block.removeprefix(BOM) if position == 0 else block, quotes)
        if found < 0:
            return None
        data = tail + block
        base = position - len(tail)  # the file's offset of data[0]
        end = position + len(block)
        if position == 0 and block.startswith(BOM):
            content_start = len(BOM)
        scan = _Scan(data, len(tail), quotes, max(0, content_start - base))
        while seek < end:
            at = scan.record_end(max(seek, position) - base)
            if at < 0:
                break
            if header_end < 0:
                header_end = base + at + 1
                seek = max(part_bytes - 1, header_end)
            else:
                cuts.append(base + at + 1)
                seek = cuts[-1] + part_bytes - 1
        quotes += found
        kept = len(block.rstrip(LINE_ENDS))
        content_end = position + kept if kept else content_end
        tail = block[-2:]
        position = end
    return [cut for cut in cuts if cut < content_end], max(header_end, 0)


class _QuoteGrammar:
    """The quote rule of the module's docstring, checked block by block over a file: every
    quote of a block at once (numpy), the bytes around a block's edges carried over."""

    def __init__(self) -> None:
        self.before = NEWLINE[0]  # the byte before the next block; the file's start is one
        self.unfollowed = False  # the last block ended with a quote at odd q

    def quotes(self, block: bytes, counted: int) -> int:
        """The number of quotes in ``block``, ``counted`` quotes before it; -1 if one of
        them, or the last block's last, stands where the rule puts none."""
        codes = np.frombuffer(block, dtype=np.uint8)
        if not codes.size:
            return 0
        if self.unfollowed and not FIELD_EDGE[codes[0]]:
            return -1
        at = np.flatnonzero(codes == QUOTE[0])
        # Quotes at even q and at odd q, alternately from the first (at q = counted).
        evens, odds = (at[0::2], at[1::2]) if counted % 2 == 0 else (at[1::2], at[0::2])
        if evens.size and evens[0] == 0:
            if not FIELD_EDGE[self.before]:
                return -1
            evens = evens[1:]
        self.unfollowed = bool(odds.size and odds[-1] == codes.size - 1)
        if self.unfollowed:
            odds = odds[:-1]
        if not (FIELD_EDGE[codes[evens - 1]].all() and FIELD_EDGE[codes[odds + 1]].all()):
            return -1
        self.before = int(codes[-1])
        return int(at.size)


class _Scan:
    """One block's line ends, looked at in order, with the parity of the quotes before
    each; ``quotes`` were counted before ``data[counted_from]``."""

    def __init__(self, data: bytes, counted_from: int, quotes: int, starts_at: int = 0) -> None:
        self.data, self.checked, self.parity = data, counted_from, quotes % 2
        self.starts_at = starts_at  # where the file's content starts in ``data`` (after a BOM)

    def record_end(self, at: int) -> int:
        """The index of the first line end at or after ``at`` (never before one asked for
        earlier) that ends a non-empty record, or -1."""
        data = self.data
        newline = data.find(NEWLINE, max(at, self.checked))
        while newline >= 0:
            self.parity = (self.parity + data.count(QUOTE, self.checked, newline)) % 2
            self.checked = newline + 1  # a line end is no quote
            if self.parity == 0 and not _empty_line(data, newline, self.starts_at):
                return newline
            newline = data.find(NEWLINE, newline + 1)
        return -1


def _empty_line(data: bytes, newline: int, starts_at: int = 0) -> bool:
    """Whether the line ending at ``data[newline]`` holds nothing (pyarrow skips it);
    ``data`` holds content from ``starts_at`` on."""
    before = newline - 1
    if before >= starts_at and data[before : before + 1] == CR:
        before -= 1
    return before < starts_at or data[before : before + 1] in (NEWLINE, CR)


def header_names(header: bytes) -> list[str]:
    """The column names in ``header``, the file's first record (with any BOM or blank
    lines before it), as pyarrow reads them."""
    return names_at(lambda at, n: header[at : at + n], len(header))


def names_at(read: Reader, size: int) -> list[str]:
    """The column names of the CSV file of ``size`` bytes ``read`` reads (its first block's
    rows are parsed too: pyarrow reads a block to find them)."""
    with pacsv.open_csv(RangeStream(read, 0, size), parse_options=CSV_PARSING) as reader:
        return list(reader.schema.names)


class RangeStream:
    """Bytes ``[start, stop)`` of a file as a stream for pyarrow, read as asked.

    pyarrow cannot read a file whose only record has no line end (``Empty CSV file or
    block``); such a stream gets one at its end, in the same read as its last bytes (a
    record outside quotes: no value changes).
    """

    def __init__(self, read: Reader, start: int, stop: int) -> None:
        self._read, self._position, self._stop = read, start, stop
        self._one_line = True  # no line end read yet
        self._quotes = 0  # counted while that holds
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        left = self._stop - self._position
        if left <= 0:
            return b""
        data = self._read(self._position, left if size < 0 else min(size, left))
        self._position += len(data)
        if self._one_line:
            self._one_line = NEWLINE not in data and CR not in data
            self._quotes += data.count(QUOTE)
            if self._one_line and self._position >= self._stop and self._quotes % 2 == 0:
                data += NEWLINE
        return data

    def close(self) -> None:
        self.closed = True


def read_csv_range(read: Reader, start: int, stop: int, columns: list[str] | None,
                   rows: int) -> Iterator[Chunk]:  # fmt: skip
    """The rows of bytes ``[start, stop)`` in chunks of up to ``rows``: from the header on
    when ``start`` is 0, else records read with ``columns`` as their names."""
    if stop <= start:
        return
    if start == 0 and columns is None:
        columns = names_at(read, stop)
    yield from read_csv_stream(RangeStream(read, start, stop), columns or [], rows,
                               header=start == 0)  # fmt: skip


def read_csv_stream(stream: Any, columns: list[str], rows: int, *, header: bool) -> Iterator[Chunk]:
    """The rows of a CSV stream in chunks of up to ``rows``, every one of ``columns`` as
    text; the stream starts with the header row, or (``header`` false) with records."""
    names = pacsv.ReadOptions() if header else pacsv.ReadOptions(column_names=columns)
    # Every column as text, as the file has it: "007" stays "007", "" stays "".
    types = dict.fromkeys(columns, pa.string())
    convert = pacsv.ConvertOptions(column_types=types, strings_can_be_null=False)
    # Closed when done or dropped, so pyarrow's read-ahead stops with the generator.
    with pacsv.open_csv(stream, read_options=names, parse_options=CSV_PARSING,
                        convert_options=convert) as reader:  # fmt: skip
        for batch in reader:
            chunk = batch.to_pydict()
            for first in range(0, batch.num_rows, rows):
                yield {name: values[first : first + rows] for name, values in chunk.items()}


def csv_ranges(read: Reader, size: int, part_bytes: int) -> list[tuple[int, int, list[str]]]:
    """The parts of a CSV file of ``size`` bytes, in order: ``(start, stop, columns)``,
    ``columns`` the header's names for reading a part that starts after it (empty for a
    file of one part, which reads its own)."""
    found = record_cuts(read, size, part_bytes) if size > part_bytes else None
    if not found or not found[0]:
        return [(0, size, [])]
    cuts, header_end = found
    columns = header_names(read(0, header_end))
    bounds = [0, *cuts, size]
    return [(start, stop, columns) for start, stop in itertools.pairwise(bounds)]


# -- a file on a pyarrow filesystem ----------------------------------------------------------


def compressed(path: str) -> bool:
    """Whether pyarrow's input streams decompress ``path`` by its name."""
    return path.lower().endswith(COMPRESSED)


def csv_columns(fs: pafs.FileSystem, path: str) -> list[str]:
    """The column names of the CSV file at ``path``."""
    if compressed(path):
        with fs.open_input_stream(path) as f:
            return list(pacsv.open_csv(f, parse_options=CSV_PARSING).schema.names)
    with fs.open_input_file(path) as f:
        return names_at(_reader(f), f.size())


def csv_file_ranges(
    fs: pafs.FileSystem, path: str, part_bytes: int
) -> list[tuple[int, int, list[str]]]:
    """:func:`csv_ranges` of the file at ``path``; a compressed one is one range, with
    its column names (every column is read as text)."""
    if compressed(path):
        return [(0, fs.get_file_info(path).size or 0, csv_columns(fs, path))]
    with fs.open_input_file(path) as f:
        return csv_ranges(_reader(f), f.size(), part_bytes)


def read_csv_part(fs: pafs.FileSystem, path: str, start: int, stop: int, columns: list[str],
                  rows: int) -> Iterator[Chunk]:  # fmt: skip
    """A part's rows (a range of :func:`csv_file_ranges`) in chunks of up to ``rows``."""
    if compressed(path):
        with fs.open_input_stream(path) as f:  # decompressed by its name
            yield from read_csv_stream(f, columns, rows, header=True)
    else:
        with fs.open_input_file(path) as f:
            yield from read_csv_range(_reader(f), start, stop, columns or None, rows)


def _reader(f: Any) -> Reader:
    """``(offset, length) -> bytes`` of an open pyarrow file."""
    return lambda at, length: f.read_at(length, at)
