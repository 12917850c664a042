"""``infergate payloads``: list the log's files, read its records with filters, export
them, and recompute a canary's shadow agreement from them."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fakes import FakeClock
from infergate.cli import main
from infergate.errors import InvalidConfig
from infergate.observe.payload_files import PayloadWriter
from infergate.observe.payload_reader import PayloadFolder, shadow_agreement
from infergate.observe.payloads import Payload
from infergate.observe.payloads_cli import parse_since

START = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def record(time_s: float, version: str, role: str, **changes) -> Payload:
    fields = dict(
        time_s=time_s, model="m", version=version, role=role, texts=["a", "b"],
        outputs=[{"label": "positive"}] * 2, latency_ms=1.0, status=200, key_id="",
    )  # fmt: skip
    fields.update(changes)
    return Payload(**fields)  # type: ignore[arg-type]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Two flushes an hour apart: champion, canary and shadow records of model m."""
    clock = FakeClock(START + 5)
    writer = PayloadWriter(str(tmp_path / "log"), "r1", texts="keep", clock=clock)
    writer([record(START, "1", "champion"), record(START + 1, "2", "canary")])
    clock.advance(3600)
    writer(
        [
            record(START + 3600, "1", "champion", model="other"),
            record(START + 3601, "2", "shadow", agreement=[1.0, 0.0], champion_version="1"),
            record(START + 3602, "2", "shadow", agreement=[1.0, 1.0], champion_version="1"),
            record(START + 3603, "2", "shadow", outputs=None, status=503),  # failed: disagrees
            record(START + 3604, "2", "shadow", outputs=None, status=422),  # refused: not judged
        ]
    )
    return tmp_path / "log"


def run(capsys, *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    return code, capsys.readouterr().out.splitlines()


def test_list_shows_each_file_with_its_records_size_and_time_span(folder, capsys):
    code, lines = run(capsys, "payloads", "list", "--url", str(folder))
    assert code == 0 and lines[0].split()[:3] == ["file", "records", "size"]
    first, second = (line.split() for line in lines[1:3])
    assert first[1] == "2" and "2027-01-15 08:00:00" in lines[1] and "08:00:01" in lines[1]
    assert second[1] == "5"
    assert lines[-1].startswith("2 files, 7 records")


def test_read_filters_by_model_version_and_role(folder, capsys):
    _, lines = run(capsys, "payloads", "read", "--url", str(folder), "--model", "m", "--version",
                   "2", "--role", "shadow")  # fmt: skip
    records = [json.loads(line) for line in lines]
    assert [r["status"] for r in records] == [200, 200, 503, 422]
    assert records[0]["inputs"] == ["a", "b"] and records[0]["time"] == "2027-01-15T09:00:01+00:00"
    assert json.loads(records[0]["outputs"]) == [{"label": "positive"}] * 2


def test_read_since_skips_older_records_and_limit_stops_early(folder, capsys):
    since = "2027-01-15T08:00:01"
    _, lines = run(capsys, "payloads", "read", "--url", str(folder), "--since", since)
    assert [json.loads(line)["role"] for line in lines] == ["canary", "champion"] + ["shadow"] * 4
    _, lines = run(capsys, "payloads", "read", "--url", str(folder), "--limit", "2")
    assert len(lines) == 2


def test_since_takes_a_time_ago_or_an_iso_time():
    now = FakeClock(START)
    assert parse_since("90m", now) == START - 5400 and parse_since("1d", now) == START - 86400
    assert parse_since("2027-01-15T08:00:00") == START  # UTC unless it says otherwise
    assert parse_since("2027-01-15T09:00:00+01:00") == START
    with pytest.raises(InvalidConfig, match="--since 'yesterday'"):
        parse_since("yesterday")


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_export_writes_the_matching_records_to_one_file(folder, tmp_path, capsys, suffix):
    out = tmp_path / "out" / f"canary{suffix}"
    code, _ = run(capsys, "payloads", "export", str(out), "--url", str(folder), "--role", "canary")
    assert code == 0
    if suffix == ".parquet":
        rows = pq.read_table(out).to_pylist()
    else:
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["version"], r["role"]) for r in rows] == [("2", "canary")]


def test_an_empty_or_absent_log_lists_nothing_and_exports_an_empty_file(tmp_path, capsys):
    code, lines = run(capsys, "payloads", "list", "--url", str(tmp_path / "none"))
    assert code == 0 and lines == []
    out = tmp_path / "empty.parquet"
    assert run(capsys, "payloads", "export", str(out), "--url", str(tmp_path / "none"))[0] == 0
    assert pq.read_table(out).num_rows == 0


def test_the_log_is_under_the_state_dir_unless_configured(folder, tmp_path, capsys):
    state = folder.parent / "state"
    state.mkdir()
    folder.rename(state / "payloads")
    _, lines = run(capsys, "payloads", "read", "--state-dir", str(state), "--role", "canary")
    assert len(lines) == 1


def test_agreement_counts_failures_as_disagreeing_and_refusals_not_at_all(folder):
    records = PayloadFolder(str(folder)).records()
    agreement = shadow_agreement(r for r in records if r["version"] == "2")
    # 1 + 0, 1 + 1, and the failed request's two texts at 0: 3 of 6.
    assert (agreement.records, agreement.texts, agreement.share) == (3, 6, 0.5)
    assert shadow_agreement([]).share is None


def test_the_agreement_command_prints_the_share(folder, capsys):
    argv = ("payloads", "agreement", "--url", str(folder), "--model", "m", "--version")
    code, lines = run(capsys, *argv, "2")
    assert code == 0 and lines == ["m v2 in shadow: 0.500 of 6 texts agreed (3 records)"]
    assert run(capsys, *argv, "9")[0] != 0  # no shadow record of v9
