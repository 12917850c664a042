"""The payload log's files: a new file per flush, names no two replicas share, a bound on
the folder's size, and the texts kept, hashed or dropped as configured."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from fakes import FakeClock
from infergate.observe.payload_files import SCHEMA, PayloadWriter, stored_files, to_table
from infergate.observe.payloads import Payload


def payload(texts: list[str] | None = ["good", "bad"], **changes) -> Payload:  # noqa: B006
    fields = dict(
        time_s=1_800_000_000.0, model="m", version="1", role="champion", texts=texts,
        outputs=[{"label": "positive", "score": np.float32(0.75)}], latency_ms=3.5,
        status=200, key_id="team-a",
    )  # fmt: skip
    fields.update(changes)
    return Payload(**fields)  # type: ignore[arg-type]


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_each_flush_is_a_new_file_named_by_time_then_replica(tmp_path: Path):
    clock = FakeClock(1_800_000_000.0)
    writer = PayloadWriter(str(tmp_path), "host-7-abc", clock=clock)
    writer([payload()])
    clock.advance(10.5)
    writer([payload(), payload()])
    assert names(tmp_path) == [
        "payloads-20270115T080000.000Z-host-7-abc-000001.parquet",
        "payloads-20270115T080010.500Z-host-7-abc-000002.parquet",
    ]
    assert [pq.read_table(tmp_path / name).num_rows for name in names(tmp_path)] == [1, 2]


def test_two_replicas_flushing_at_once_never_write_the_same_file(tmp_path: Path):
    clock = FakeClock(1_800_000_000.0)
    for replica in ("host-7-abc", "host-8-def"):
        PayloadWriter(str(tmp_path), replica, clock=clock)([payload()])
    assert len(names(tmp_path)) == 2  # and no half-written file left beside them


def test_past_the_size_bound_the_oldest_files_go(tmp_path: Path):
    clock = FakeClock(1_800_000_000.0)
    writer = PayloadWriter(str(tmp_path), "r", clock=clock)
    writer([payload()])
    one_file = (tmp_path / names(tmp_path)[0]).stat().st_size
    # Room for three files: the fourth and fifth push out the first two.
    writer.max_bytes = int(3.5 * one_file)
    for _ in range(4):
        clock.advance(1)
        writer([payload()])
    kept = names(tmp_path)
    assert [name.rsplit("-", 1)[1] for name in kept] == [f"00000{i}.parquet" for i in (3, 4, 5)]
    assert sum(f.size for f in stored_files(writer.fs, writer.folder)) <= writer.max_bytes


def test_the_file_just_written_stays_even_alone_over_the_bound(tmp_path: Path):
    writer = PayloadWriter(str(tmp_path), "r", max_total_mb=1e-6, clock=FakeClock())
    writer([payload()])
    writer([payload()])
    assert [name.rsplit("-", 1)[1] for name in names(tmp_path)] == ["000002.parquet"]


def test_texts_are_kept_hashed_or_dropped():
    texts = ["good", "lone \ud800 surrogate"]
    kept, hashed, dropped = (
        to_table([payload(texts)], mode).column("inputs")[0].as_py()
        for mode in ("keep", "hash", "drop")
    )
    assert kept == ["good", "lone ? surrogate"]
    assert hashed[0] == "sha256:" + hashlib.sha256(b"good").hexdigest()
    assert all(len(h) == len("sha256:") + 64 for h in hashed)
    assert dropped is None
    assert to_table([payload(texts)], "drop").column("texts")[0].as_py() == 2  # still counted


def test_a_record_holds_the_answer_as_json_and_the_key_id():
    row = to_table([payload()], "keep").to_pylist()[0]
    assert json.loads(row["outputs"]) == [{"label": "positive", "score": 0.75}]
    assert row["key_id"] == "team-a" and row["status"] == 200 and row["latency_ms"] == 3.5
    assert row["time"].timestamp() == 1_800_000_000.0
    assert row["agreement"] is None and row["champion_version"] is None


def test_a_call_whose_body_was_not_read_is_recorded_with_what_there_is():
    unread = payload(texts=None, version="", role="", outputs=None, status=422)
    row = to_table([unread], "keep").to_pylist()[0]
    assert (row["texts"], row["inputs"], row["outputs"], row["status"]) == (None, None, None, 422)


def test_a_shadow_record_holds_its_agreement_and_the_champion_answer_compared():
    shadow = payload(
        role="shadow", version="2", agreement=np.array([1.0, 0.0]), champion_version="1",
        champion_outputs=[{"label": "negative"}],
    )  # fmt: skip
    row = to_table([shadow], "hash").to_pylist()[0]
    assert row["agreement"] == [1.0, 0.0] and row["champion_version"] == "1"
    assert json.loads(row["champion_outputs"]) == [{"label": "negative"}]


def test_the_schema_names_every_field_the_brief_asks_for():
    wanted = {"time", "model", "version", "role", "inputs", "outputs", "latency_ms", "status"}
    assert wanted | {"key_id", "agreement"} <= set(SCHEMA.names)


@pytest.mark.parametrize("url", ["payloads", "relative/folder"])
def test_a_relative_folder_is_taken_from_the_working_directory(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    PayloadWriter(url, "r", clock=FakeClock())([payload()])
    assert len(names(tmp_path / url)) == 1


def test_a_url_is_written_through_its_pyarrow_filesystem_whole_files_at_once():
    # pyarrow's in-memory filesystem stands in for an object store (s3://, gs://): no
    # partial file and rename there, an object appears once it is whole.
    writer = PayloadWriter("mock:///bucket/payloads", "r", clock=FakeClock())
    writer([payload()])
    writer([payload(), payload()])
    files = stored_files(writer.fs, writer.folder)
    assert [f.name.rsplit("-", 1)[1] for f in files] == ["000001.parquet", "000002.parquet"]
    assert pq.read_table(files[1].path, filesystem=writer.fs).num_rows == 2
