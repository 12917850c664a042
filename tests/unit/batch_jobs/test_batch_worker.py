"""A part through the actor's code (no Ray): bad rows and a model failing on some rows
get errors in their rows, the rest is answered and written."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from infergate.batch.files import Part, filesystem
from infergate.batch.rows import added_name
from infergate.batch.worker import PROBE_TEXT, PartRunner, WorkerSpec, arrow_type, node_address
from infergate.errors import InvalidInput
from infergate.protocols.wire import Limits
from infergate.tasks import get
from infergate.versions import ServedVersion


class RuntimeFailingOnBoom:
    """Stands in for ModelRuntime: labels a text by its length, and fails any call whose
    texts include "boom" (as an engine failing on one row fails its whole batch)."""

    task = get("text-ranking")

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], dict]] = []

    async def predict(self, texts, parameters, backend):
        self.calls.append((list(texts), dict(parameters)))
        if "boom" in texts:
            raise InvalidInput("the model cannot read 'boom'")
        return SimpleNamespace(outputs=[{"score": float(len(t))} for t in texts])


@pytest.fixture
def loops():
    made: list[asyncio.AbstractEventLoop] = []
    yield made
    for loop in made:
        loop.close()


def runner(tmp_path, runtime, loops, **kw) -> PartRunner:
    spec = WorkerSpec(
        served=ServedVersion("ranker", "3", "text-ranking", "runs:/x"),
        tracking_uri="http://unused",
        column="text",
        query_column=kw.get("query_column"),
        parameters={},
        batch_size=kw.get("batch_size", 4),
        input=str(tmp_path / "in.jsonl"),
        output=str(tmp_path / "out"),
        output_format=kw.get("output_format", "jsonl"),
        limits=Limits(1 << 20, 64, 20),
        input_columns=kw.get("input_columns", ()),
    )
    worker = PartRunner.__new__(PartRunner)  # what __init__ loads from the registry, by hand
    worker.spec, worker.runtime, worker.backend, worker.task = spec, runtime, None, runtime.task
    worker.loop = asyncio.new_event_loop()
    loops.append(worker.loop)
    worker.input_fs, _ = filesystem(spec.input)
    worker.fs, worker.output = filesystem(spec.output)
    worker.node = node_address()
    worker.actor, worker.load_s = "local/1", 2.5
    worker.answer_types = worker.probe()
    return worker


def test_a_part_with_bad_rows_and_a_failing_row_is_written_whole(tmp_path, loops):
    rows = [{"text": "good", "q": "a"}, {"text": "", "q": "a"}, {"text": "boom", "q": "a"},
            {"text": 5, "q": "a"}, {"text": "fine too", "q": ""}, {"text": "x" * 21, "q": "a"},
            {"text": "last", "q": "b"}]  # fmt: skip
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    runtime = RuntimeFailingOnBoom()
    worker = runner(tmp_path, runtime, loops, query_column="q")
    part = Part(0, str(source), "jsonl", start=0, stop=source.stat().st_size)
    figures = worker({"part": [part.to_json()]})
    assert figures["rows"] == [8] and figures["errors"] == [6] and figures["failure"] == [""]
    assert figures["node"] == ["local"]  # outside Ray
    # What the driver tells start-up from work by: the actor, its load, the part's times.
    assert figures["actor"] == ["local/1"] and figures["load_s"] == [2.5]
    assert figures["began"][0] <= figures["ended"][0] and figures["cpu_s"][0] >= 0
    assert 0 <= figures["waited_s"][0] <= figures["seconds"][0]
    lines = (tmp_path / "out" / "part-00000.jsonl").read_text().splitlines()
    written = [json.loads(line) for line in lines]
    assert [(r.get("text"), r["score"], r["version"]) for r in written] == [
        ("good", 4.0, "3"), ("", None, "3"), ("boom", None, "3"), (5, None, "3"),
        ("fine too", None, "3"), ("x" * 21, None, "3"), ("last", 4.0, "3"), (None, None, "3"),
    ]  # fmt: skip
    errors = [r["error"] for r in written]
    assert errors[0] is None and errors[6] is None
    assert "empty" in errors[1] and errors[2] == "the model cannot read 'boom'"
    assert "must be a string" in errors[3] and "the query is empty" in errors[4]
    assert "21 characters" in errors[5] and "not JSON" in errors[7]
    # The probe for the answer's columns, then one call for each chunk of 4 rows, the
    # failing one row by row; the queries go with their texts.
    assert runtime.calls[0] == ([PROBE_TEXT], {"query": [PROBE_TEXT]})
    assert runtime.calls[1] == (["good", "boom"], {"query": ["a", "a"]})
    assert runtime.calls[2:4] == [(["good"], {"query": ["a"]}), (["boom"], {"query": ["a"]})]
    assert runtime.calls[4] == (["last"], {"query": ["b"]})


def test_an_unreadable_part_is_reported_not_raised(tmp_path, loops):
    worker = runner(tmp_path, RuntimeFailingOnBoom(), loops)
    missing = Part(4, str(tmp_path / "gone.jsonl"), "jsonl", start=0, stop=10)
    figures = worker({"part": [missing.to_json()]})
    assert figures["part"] == [4] and "gone.jsonl" in figures["failure"][0]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("part-*"))


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_answers_after_a_chunk_of_refused_rows_are_kept(tmp_path, loops, fmt):
    # The first chunk has no answer at all; the file's columns are fixed by then.
    rows = [{"text": ""}, {"text": ""}, {"text": "good"}, {"text": "also good"}]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    worker = runner(tmp_path, RuntimeFailingOnBoom(), loops, batch_size=2, output_format=fmt)
    part = Part(0, str(source), "jsonl", start=0, stop=source.stat().st_size)
    assert worker({"part": [part.to_json()]})["errors"] == [2]
    out = tmp_path / "out" / f"part-00000.{fmt}"
    table = pq.read_table(out) if fmt == "parquet" else pacsv.read_csv(out)
    assert table.column_names == ["text", "score", "version", "error"]
    assert table.column("score").to_pylist() == [None, None, 4.0, 9.0]


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_part_of_refused_rows_has_the_answer_columns_typed(tmp_path, loops, fmt):
    # Every row refused: the part's file still has the answer's columns, of the type the
    # other parts' answers have, so a reader of the whole folder takes it.
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": ""}) + "\n")
    worker = runner(tmp_path, RuntimeFailingOnBoom(), loops, output_format=fmt)
    part = Part(0, str(source), "jsonl", start=0, stop=source.stat().st_size)
    assert worker({"part": [part.to_json()]})["errors"] == [1]
    out = tmp_path / "out" / f"part-00000.{fmt}"
    table = pq.read_table(out) if fmt == "parquet" else pacsv.read_csv(out)
    assert table.column_names == ["text", "score", "version", "error"]
    if fmt == "parquet":
        assert table.schema.field("score").type == pa.float64()


def test_the_probe_types_only_what_its_answer_tells():
    assert arrow_type([0.5]) == pa.float64()
    assert arrow_type([[]]) is None  # no entity found: a list of what?
    assert arrow_type([{"a": 1}, {"a": "x"}]) is None  # mixed: left to the answers


def test_a_column_the_input_has_is_kept_and_the_answers_go_beside_it(tmp_path, loops):
    # A labelled data set scored against its own labels: its `score`, `version` and
    # `error` stay; what the job adds goes in infergate_score, infergate_version, ...
    rows = [{"text": "good", "score": 1, "version": "gold", "error": "none"}, {"text": ""}]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    worker = runner(tmp_path, RuntimeFailingOnBoom(), loops, query_column=None,
                    input_columns=("text", "score", "version", "error"))  # fmt: skip
    worker.spec = replace(worker.spec, parameters={"query": "q"})
    worker.answer_types = worker.probe()
    part = Part(0, str(source), "jsonl", start=0, stop=source.stat().st_size)
    assert worker({"part": [part.to_json()]})["errors"] == [1]
    lines = (tmp_path / "out" / "part-00000.jsonl").read_text().splitlines()
    written = [json.loads(line) for line in lines]
    assert written[0] == {
        "text": "good", "score": 1, "version": "gold", "error": "none",
        "infergate_score": 4.0, "infergate_version": "3", "infergate_error": None,
    }  # fmt: skip
    assert written[1]["infergate_score"] is None and "empty" in written[1]["infergate_error"]
    assert added_name("score", {"score", "infergate_score"}) == "infergate_infergate_score"
