"""Parts of the input (each row in exactly one), and part files written whole."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infergate.batch import files
from infergate.batch.files import (
    BAD_LINE,
    PartWriter,
    columns_of,
    filesystem,
    input_files,
    plan,
    read_part,
    settled,
    written_parts,
)
from infergate.errors import BatchError


def rows_of(fs, parts, size=4):
    return [row for p in parts for chunk in read_part(fs, p, size)
            for row in zip(*chunk.values(), strict=True)]  # fmt: skip


@pytest.mark.parametrize("part_bytes", [1, 7, 50, 1 << 20])
def test_json_lines_parts_hold_every_line_once(tmp_path, part_bytes):
    path = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": f"row {i} " + "x" * (i % 13)}) for i in range(40)]
    path.write_text("\n".join(lines) + "\n")
    fs, folder = filesystem(str(tmp_path))
    parts = plan(fs, input_files(fs, folder, "jsonl", "in"), "jsonl", 0, part_bytes)
    assert [p.index for p in parts] == list(range(len(parts)))
    assert [r[0] for r in rows_of(fs, parts)] == [json.loads(x)["text"] for x in lines]


def test_a_line_that_is_not_an_object_is_a_row_error(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "a"}\n[1, 2]\n{broken\n')
    fs, name = filesystem(str(path))
    chunk = next(read_part(fs, plan(fs, [name], "jsonl", 0, 100)[0], 10))
    assert chunk["text"] == ["a", None, None]
    assert chunk[BAD_LINE][0] is None and "not a JSON object" in chunk[BAD_LINE][1]
    assert "not JSON" in chunk[BAD_LINE][2]


def test_parquet_row_groups_are_gathered_into_parts(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [str(i) for i in range(25)]}), path, row_group_size=5)
    fs, name = filesystem(str(path))
    parts = plan(fs, [name], "parquet", 10, 0)
    assert [p.row_groups for p in parts] == [(0, 1), (2, 3), (4,)]
    assert [p.weight for p in parts] == [10, 10, 5]
    assert [r[0] for r in rows_of(fs, parts, 3)] == [str(i) for i in range(25)]


def test_csv_cells_are_read_as_text(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("id,text\n007,\n2,hello\n")
    fs, name = filesystem(str(path))
    assert columns_of(fs, name, "csv") == ["id", "text"]
    (chunk,) = read_part(fs, plan(fs, [name], "csv", 0, 1 << 20)[0], 10)
    assert chunk == {"id": ["007", "2"], "text": ["", "hello"]}


def test_unreadable_and_missing_inputs_are_one_line(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"nope")
    fs, folder = filesystem(str(tmp_path))
    with pytest.raises(BatchError, match=r"bad\.parquet is not a readable parquet file"):
        columns_of(fs, f"{folder}/bad.parquet", "parquet")
    with pytest.raises(BatchError, match="does not exist"):
        input_files(fs, f"{folder}/none.csv", "csv", "none.csv")
    with pytest.raises(BatchError, match="no csv files in it"):
        input_files(fs, folder, "csv", "the folder")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_a_part_appears_only_when_whole(tmp_path, fmt):
    fs, folder = filesystem(str(tmp_path / "out"))
    writer = PartWriter(fs, folder, f"part-00000.{fmt}", fmt)
    writer.write({"text": ["a"], "label": [None], "scores": [None]})  # types unknown yet
    writer.write({"text": ["b"], "label": ["pos"], "scores": [{"pos": 1.0}]})
    assert written_parts(fs, folder) == set()
    writer.commit()
    assert written_parts(fs, folder) == {f"part-00000.{fmt}"}
    if fmt == "parquet":
        rows = pq.read_table(tmp_path / "out" / "part-00000.parquet").to_pylist()
        assert rows[1] == {"text": "b", "label": "pos", "scores": {"pos": 1.0}}
    else:
        assert "pos" in (tmp_path / "out" / f"part-00000.{fmt}").read_text()


@pytest.mark.parametrize(("fmt", "empty"), [("csv", "id,text\n"), ("jsonl", "")])
def test_a_part_with_no_rows_leaves_a_mark_a_rerun_knows_not_an_empty_file(tmp_path, fmt,
                                                                           empty):  # fmt: skip
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / f"a.{fmt}").write_text(
        "id,text\n1,x\n2,y\n" if fmt == "csv" else '{"id": "1", "text": "x"}\n'
    )
    (tmp_path / "in" / f"b.{fmt}").write_text(empty)  # a header-only or an empty file
    fs, folder = filesystem(str(tmp_path / "in"))
    parts = plan(fs, input_files(fs, folder, fmt, "in"), fmt, 0, 1 << 20)
    out_fs, out = filesystem(str(tmp_path / "out"))
    for part in parts:
        writer = PartWriter(out_fs, out, part.output_name("parquet"), "parquet")
        for chunk in read_part(fs, part, 4):
            writer.write(chunk)
        writer.commit()
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["_part-00001.parquet.empty", "part-00000.parquet"]
    assert written_parts(out_fs, out) == {"part-00000.parquet", "part-00001.parquet"}
    # The folder reads as one table: readers pass the mark by.
    assert pq.read_table(tmp_path / "out").column("text").to_pylist()[0] == "x"


def test_a_parquet_part_gathers_chunks_into_row_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "ROW_GROUP_ROWS", 100)
    fs, folder = filesystem(str(tmp_path))
    writer = PartWriter(fs, folder, "part-00000.parquet", "parquet", {"error": pa.string()})
    for start in range(0, 330, 32):  # a model call's rows at a time, the last one short
        ids = list(range(start, min(start + 32, 330)))
        writer.write({"id": ids, "error": [None] * len(ids)})
    writer.commit()
    file = pq.ParquetFile(tmp_path / "part-00000.parquet")
    sizes = [file.metadata.row_group(i).num_rows for i in range(file.metadata.num_row_groups)]
    assert sizes == [128, 128, 74]  # four chunks of 32 reach 100; the rest at the commit
    assert file.read().column("id").to_pylist() == list(range(330))


def test_an_aborted_part_leaves_nothing(tmp_path):
    fs, folder = filesystem(str(tmp_path))
    writer = PartWriter(fs, folder, "part-00001.jsonl", "jsonl")
    writer.write({"text": ["a"]})
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_parts_agree_on_the_type_of_a_column_null_in_some(tmp_path):
    fs, folder = filesystem(str(tmp_path))
    for name, error in (("part-00000.parquet", None), ("part-00001.parquet", "empty")):
        writer = PartWriter(fs, folder, name, "parquet", {"error": pa.string()})
        writer.write({"text": ["a"], "error": [error]})
        writer.commit()
    assert pq.read_table(tmp_path).column("error").to_pylist() == [None, "empty"]


@pytest.mark.parametrize("part_bytes", [1 << 20, 8 << 20])
def test_csv_fields_with_line_breaks_are_read_across_blocks(tmp_path, part_bytes):
    # Over pyarrow's 1 MiB read block: a break inside a quoted field near a block's end
    # is only read right when the parser is told such breaks exist.
    path = tmp_path / "in.csv"
    texts = [f"line one {i}\nline two {i} " + "x" * 40 for i in range(30_000)]
    path.write_text("id,text\n" + "".join(f'{i},"{t}"\n' for i, t in enumerate(texts)))
    assert path.stat().st_size > 2 << 20
    fs, name = filesystem(str(path))
    assert columns_of(fs, name, "csv") == ["id", "text"]
    parts = plan(fs, [name], "csv", 0, part_bytes)
    assert len(parts) == (3 if part_bytes == 1 << 20 else 1)
    assert [r[1] for r in rows_of(fs, parts, 4096)] == texts


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_json_lines_column_first_seen_late_reaches_a_csv_or_parquet_part(tmp_path, fmt):
    path = tmp_path / "in.jsonl"
    lines = [{"text": str(i)} for i in range(10)] + [{"text": "10", "lang": "de"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    fs, name = filesystem(str(path))
    (part,) = plan(fs, [name], "jsonl", 0, 1 << 20)
    out_fs, folder = filesystem(str(tmp_path / "out"))
    writer = PartWriter(out_fs, folder, f"part-00000.{fmt}", fmt)
    for chunk in read_part(fs, part, 4):  # the first chunks have no "lang"
        writer.write(chunk)
    writer.commit()
    written = tmp_path / "out" / f"part-00000.{fmt}"
    if fmt == "csv":
        header, *_, last = written.read_text().splitlines()
        assert (header, last) == ("text,lang", "10,de")
    else:
        assert pq.read_table(written).column("lang").to_pylist() == [None] * 10 + ["de"]


def test_chunks_of_empty_lists_wait_for_one_that_types_them(tmp_path):
    # NER over texts with no entity: list<null> until a chunk has one.
    fs, output = filesystem(str(tmp_path / "out"))
    writer = PartWriter(fs, output, "part-00000.parquet", "parquet")
    writer.write({"text": ["a", "b"], "entities": [[], []]})
    writer.write({"text": ["c"], "entities": [[{"word": "Paris", "score": 0.9}]]})
    writer.commit()
    table = pq.read_table(tmp_path / "out" / "part-00000.parquet")
    assert table.column("entities").to_pylist() == [[], [], [{"word": "Paris", "score": 0.9}]]
    assert settled(table.schema.field("entities").type)
    assert not settled(pa.list_(pa.null())) and settled(pa.list_(pa.string()))


def test_a_column_first_seen_past_a_row_group_keeps_its_type(tmp_path):
    # No value for "note" in the first row group's worth of rows: the schema waits.
    fs, output = filesystem(str(tmp_path / "out"))
    writer = PartWriter(fs, output, "part-00000.parquet", "parquet")
    rows = files.ROW_GROUP_ROWS + 10
    writer.write({"text": ["a"] * rows, "note": [None] * rows})
    writer.write({"text": ["b"], "note": ["late"]})
    writer.commit()
    table = pq.read_table(tmp_path / "out" / "part-00000.parquet")
    assert table.schema.field("note").type == pa.string()
    assert table.column("note").to_pylist()[-2:] == [None, "late"]
