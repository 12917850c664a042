"""CSV files cut into parts at record boundaries: every part's rows, joined, are the rows
pyarrow reads from the whole file, whatever the part size; a file whose quotes are not
all where the standard puts them is not split."""

from __future__ import annotations

import csv
import io
import random

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from infergate.batch import csv_parts
from infergate.batch.csv_parts import CSV_PARSING, csv_ranges, read_csv_range, record_cuts
from infergate.batch.files import Part, columns_of, filesystem, plan, read_part

CASES = {
    "bom and CRLF": b'\xef\xbb\xbfid,text\r\n1,"a\r\nb"\r\n2,plain\r\n3,"c"\r\n',
    "no line end at the end": b"id,text\n1,a\n2,b\n3,last",
    "quoted line breaks and doubled quotes": (
        b'id,text\n1,"say ""hi""\nthen go"\n2,"x,\n\n""y"""\n3,""\n4,"end\n"\n'
    ),
    "blank lines": b'\n\nid,text\n1,x\n\n\n2,"y\n\nz"\n\n\n',
    "a bom, then blank lines": b"\xef\xbb\xbf\n\r\nid,text\n1,x\n2,y\n",
    "a header with a line break": b'"i\nd",text\n1,x\n2,y\n',
    "a bom before a quoted header": b'\xef\xbb\xbf"id","text"\n"1","x"\n"2","y"\n',
    "header only": b"id,text\n",
    "header only, no line end": b"id,text",
    "empty": b"",
}


def whole_file_rows(data: bytes) -> list[tuple[str, ...]]:
    """The rows as pyarrow reads the whole file, every column as text (the reading
    before files were split)."""
    if not data:
        return []
    if b"\n" not in data and b"\r" not in data:
        data += b"\n"  # pyarrow reads no header without a line end after it
    names = pacsv.read_csv(io.BytesIO(data), parse_options=CSV_PARSING).schema.names
    convert = pacsv.ConvertOptions(
        column_types=dict.fromkeys(names, pa.string()), strings_can_be_null=False
    )
    table = pacsv.read_csv(io.BytesIO(data), parse_options=CSV_PARSING, convert_options=convert)
    return [tuple(row.values()) for row in table.to_pylist()]


def parts_of(tmp_path, data: bytes, part_bytes: int) -> tuple[object, list[Part]]:
    path = tmp_path / "in.csv"
    path.write_bytes(data)
    fs, name = filesystem(str(path))
    return fs, plan(fs, [name], "csv", 0, part_bytes)


def rows_of(fs, parts: list[Part], rows: int = 2) -> list[list[tuple[str, ...]]]:
    """Each part's rows."""
    return [
        [row for chunk in read_part(fs, part, rows) for row in zip(*chunk.values(), strict=True)]
        for part in parts
    ]


@pytest.mark.parametrize("scan_bytes", [3, 1 << 20])  # blocks of 3 bytes: cuts across blocks
@pytest.mark.parametrize("case", list(CASES))
def test_the_parts_of_a_file_hold_its_rows_whatever_the_part_size(
    tmp_path, monkeypatch, case, scan_bytes
):
    monkeypatch.setattr(csv_parts, "SCAN_BLOCK_BYTES", scan_bytes)
    data = CASES[case]
    expected = whole_file_rows(data)
    for part_bytes in range(1, len(data) + 2):
        fs, parts = parts_of(tmp_path, data, part_bytes)
        each = rows_of(fs, parts)
        assert [row for rows in each for row in rows] == expected, (part_bytes, parts)
        # Byte ranges end to end over the file, weighted by their bytes.
        assert [p.start for p in parts] == [0] + [p.stop for p in parts[:-1]]
        assert parts[-1].stop == len(data) and [p.weight for p in parts] == [
            p.stop - p.start for p in parts
        ]
        if len(parts) > 1:  # a split file's every part holds a row
            assert all(each), (part_bytes, parts)


def test_parts_are_cut_at_record_ends_at_least_part_bytes_apart(tmp_path):
    data = b'id,text\n1,"a\nb"\n2,c\n3,d\n4,e\n5,f\n'
    fs, parts = parts_of(tmp_path, data, 10)
    # Not at the line end inside "a\nb" (after byte 12), the first after the 10th byte;
    # then the first record start 10 bytes or more after 16.
    assert [(p.start, p.stop) for p in parts] == [(0, 16), (16, 28), (28, 32)]
    assert [p.columns for p in parts] == [("id", "text")] * 3
    assert rows_of(fs, parts) == [
        [("1", "a\nb")],
        [("2", "c"), ("3", "d"), ("4", "e")],
        [("5", "f")],
    ]


@pytest.mark.parametrize("ending", [".gz", ".bz2", ".zst"])
def test_a_compressed_file_is_one_part_read_whole_as_text(tmp_path, ending):
    data = CASES["quoted line breaks and doubled quotes"] + b'5,007\n6,"1.5"\n'
    path = tmp_path / f"in.csv{ending}"
    with pa.CompressedOutputStream(str(path), pa.Codec.detect(str(path)).name) as out:
        out.write(data)
    fs, name = filesystem(str(path))
    parts = plan(fs, [name], "csv", 0, 8)  # compressed bytes cannot be cut: one part
    assert [(p.start, p.stop, p.columns) for p in parts] == [
        (0, path.stat().st_size, ("id", "text"))
    ]
    assert columns_of(fs, name, "csv") == ["id", "text"]
    [rows] = rows_of(fs, parts)
    assert rows == whole_file_rows(data)  # "007" and "1.5" stay text
    assert ("5", "007") in rows


def test_a_file_no_larger_than_a_part_is_one_part(tmp_path):
    data = b"id,text\n1,a\n2,b\n"
    _, parts = parts_of(tmp_path, data, len(data))
    assert [(p.start, p.stop, p.columns) for p in parts] == [(0, len(data), ())]


# Quotes where RFC 4180 puts none: pyarrow keeps them as text or reads on its own way, so
# counting them would cut inside the quoted field after them.
OFF_GRAMMAR = [
    b'1,5" screen\n',  # inside an unquoted field
    b'1, "quoted after a space"\n',
    b'12",x\n',  # at the end of an unquoted field, then a separator...
    b'1,12"\n',  # ...or a line end: it looks like a closing quote
    b'1,"a"b\n',  # a closing quote, then an ordinary byte
    b'1,a""\n',
]


@pytest.mark.parametrize("scan_bytes", [3, 4, 5, 7, 1 << 20])  # the quote at a block's edge
@pytest.mark.parametrize("line", OFF_GRAMMAR)
def test_a_quote_outside_the_standard_keeps_the_file_whole(tmp_path, monkeypatch, line,
                                                           scan_bytes):  # fmt: skip
    monkeypatch.setattr(csv_parts, "SCAN_BLOCK_BYTES", scan_bytes)
    data = b"id,text\n" + line + b'2,"a\nb"\n3,c\n4,d\n'
    fs, parts = parts_of(tmp_path, data, 1)
    assert len(parts) == 1
    assert rows_of(fs, parts)[0] == whole_file_rows(data)


@pytest.mark.parametrize("scan_bytes", range(3, 12))
def test_quotes_where_the_standard_puts_them_are_counted_at_any_block_edge(monkeypatch,
                                                                          scan_bytes):  # fmt: skip
    monkeypatch.setattr(csv_parts, "SCAN_BLOCK_BYTES", scan_bytes)
    # A quote after the BOM, after a separator, after a line end; doubled ones (""""
    # is a field holding one quote); one closing before CR, before the file's end.
    data = b'\xef\xbb\xbf"id","text"\n"1","a""b"\r\n2,""""\n3,"x\ny"\r4,"z"'
    read = lambda at, length: data[at : at + length]  # noqa: E731
    ranges = csv_ranges(read, len(data), 1)
    # The header with the first record, then a part per record ended by LF (no cut at
    # the lone CR).
    assert len(ranges) == 3
    got = [tuple(r) for start, stop, columns in ranges
           for chunk in read_csv_range(read, start, stop, columns, 2)
           for r in zip(*chunk.values(), strict=True)]  # fmt: skip
    assert got == whole_file_rows(data)


def test_the_same_file_gives_the_same_parts_and_they_travel_as_json(tmp_path):
    data = b"id,text\n" + b"".join(b'%d,"row\n%d"\n' % (i, i) for i in range(50))
    fs, parts = parts_of(tmp_path, data, 64)
    assert len(parts) > 5 and plan(fs, [parts[0].path], "csv", 0, 64) == parts
    assert [Part.from_json(p.to_json()) for p in parts] == parts
    assert [p.output_name("parquet") for p in parts[:2]] == ["part-00000.parquet",
                                                             "part-00001.parquet"]  # fmt: skip


def test_random_files_written_by_pythons_csv_module(tmp_path, monkeypatch):
    monkeypatch.setattr(csv_parts, "SCAN_BLOCK_BYTES", 5)
    pieces = ["a", " ", ",", '"', "\n", "\r\n", "é", '""']
    rng = random.Random(7)
    for _ in range(60):
        buffer = io.StringIO()
        quoting = rng.choice([csv.QUOTE_MINIMAL, csv.QUOTE_ALL])
        writer = csv.writer(buffer, lineterminator=rng.choice(["\n", "\r\n"]), quoting=quoting)
        writer.writerow(["id", "text", "lang"])
        for i in range(rng.randint(1, 10)):
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 8)))
            writer.writerow([str(i), text, rng.choice(["en", ""])])
        data = buffer.getvalue().encode()
        expected = whole_file_rows(data)
        for part_bytes in (1, 7, 20, 64):
            fs, parts = parts_of(tmp_path, data, part_bytes)
            assert [r for rows in rows_of(fs, parts, 3) for r in rows] == expected, data


def messy_field(rng: random.Random, stray: float) -> str:
    """A field: unquoted, quoted (doubled quotes, separators, line breaks inside), or with
    probability ``stray`` any bytes at all, quotes where they fall."""
    kind = rng.random()
    if kind < stray:
        anything = ["a", '"', '"', " ", ",", "\n", "\r\n", "\r", "é"]
        return "".join(rng.choice(anything) for _ in range(rng.randint(1, 5)))
    if kind < 0.5:
        return "".join(rng.choice(["a", "b", " ", "é", "1"]) for _ in range(rng.randint(0, 4)))
    inside = ["a", " ", ",", '""', "\n", "\r\n", "é"]
    return '"' + "".join(rng.choice(inside) for _ in range(rng.randint(0, 5))) + '"'


def messy_file(rng: random.Random, stray: float) -> bytes:
    """A file of two columns, fields from ``messy_field``: blank lines, a BOM, CRLF or
    LF, a last line with or without its line end."""
    line_end = rng.choice(["\n", "\r\n"])
    records = [rng.choice(["id,text", '"id","text"', 'id,"te\nxt"'])]
    for _ in range(rng.randint(0, 8)):
        records.append(f"{messy_field(rng, stray)},{messy_field(rng, stray)}")
        if rng.random() < 0.1:
            records.append("")
    text = line_end.join(records) + (line_end if rng.random() < 0.8 else "")
    return (csv_parts.BOM if rng.random() < 0.3 else b"") + text.encode()


def test_messy_files_are_read_as_the_whole_file_split_or_not(monkeypatch):
    rng = random.Random(34)
    readable = split = kept_whole = 0
    for _ in range(400):
        stray = rng.choice([0.0, 0.05, 0.2])
        data = messy_file(rng, stray)
        try:
            expected = whole_file_rows(data)
        except pa.ArrowInvalid:  # a row of another width: no whole reading to compare with
            continue
        readable += 1
        monkeypatch.setattr(csv_parts, "SCAN_BLOCK_BYTES", rng.choice([3, 4, 5, 8, 64]))
        read = lambda at, length, data=data: data[at : at + length]  # noqa: E731
        whole = record_cuts(read, len(data), 1) is None
        assert not (whole and stray == 0.0), data  # standard quotes never keep it whole
        kept_whole += whole
        parts = 1
        for part_bytes in sorted({1, 2, rng.randint(3, 12), rng.randint(13, 40)}):
            ranges = csv_ranges(read, len(data), part_bytes)
            rows = [tuple(row) for start, stop, columns in ranges
                    for chunk in read_csv_range(read, start, stop, columns or None, 3)
                    for row in zip(*chunk.values(), strict=True)]  # fmt: skip
            assert rows == expected, (data, part_bytes)
            parts = max(parts, len(ranges))
        split += parts > 1
    # Most files are read whole by pyarrow, many are split, some kept whole for a quote
    # outside the standard.
    assert readable > 250 and split > 150 and kept_whole > 10, (readable, split, kept_whole)


def test_planning_and_reading_stream_the_file_in_bounded_reads(monkeypatch):
    monkeypatch.setattr(csv_parts, "SCAN_BLOCK_BYTES", 1 << 16)
    texts = [f"line one {i}\nline two, {i} " + "x" * 40 for i in range(40_000)]
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows([["id", "text"]] + [
        [str(i), t] for i, t in enumerate(texts)
    ])  # fmt: skip
    data = buffer.getvalue().encode()
    asked: list[int] = []

    def read(at: int, length: int) -> bytes:
        asked.append(length)
        return data[at : at + length]

    ranges = csv_ranges(read, len(data), 1 << 20)
    assert len(ranges) == 4 and max(asked) == 1 << 16  # the planner's blocks
    asked.clear()
    got = [text for start, stop, columns in ranges
           for chunk in read_csv_range(read, start, stop, columns, 1000)
           for text in chunk["text"]]  # fmt: skip
    assert got == texts
    assert max(asked) <= 1 << 20  # pyarrow's blocks, never a part at once
