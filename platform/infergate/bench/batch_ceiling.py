"""The batch cell's ceiling: ONNX Runtime in one process on the served file, over the very
texts of the batch cell's input file, at its batch size.

Run as ``python -m infergate.bench.batch_ceiling`` by the batch cell
(``infergate.bench.batch_cell``), in a process of its own as the main ceiling is
(``infergate.bench.ceiling``, whose measuring loop it uses); prints one JSON document. The
texts are tokenized beforehand, as there: the figure is the model's alone, and tokenizing
is timed apart. Both layouts of the machine (one session with a thread per core, a session
per core with one thread each) are measured and the better one kept, two ways:

- as served: the graph run as the platform runs it, online and in a batch job, with the
  serving code's own session and call (``infergate.triton.backend_model``): a graph
  marked ``rows_alone`` (dynamic INT8, whose activations are scaled over the whole input)
  runs each text alone, so that its answer does not depend on its batch-mates. This is
  the ceiling a job with the online endpoint's answers can reach.
- padded batches: every batch in one run, padding and all, as ``infergate.bench.ceiling``
  measures. For a ``rows_alone`` graph these answers differ from the served ones (a
  text's scores move with its batch-mates), so it shows what that rule costs, not what a
  job could reach.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from infergate.bench.ceiling import drive_threads, make_session, measure
from infergate.serving.tokenization import TextTokenizer
from infergate.tasks import get as get_task
from infergate.triton import backend_model

WARMUP_RUNS = 3


def read_texts(path: Path, column: str) -> list[str]:
    """The ``column`` of the Parquet file at ``path``."""
    import pyarrow.parquet as pq

    return [str(text) for text in pq.read_table(path, columns=[column]).column(column).to_pylist()]


def run(args: argparse.Namespace) -> dict[str, Any]:
    spec = json.loads(Path(args.spec).read_text())
    tokenizer = TextTokenizer.from_dir(Path(args.tokenizer), int(spec["max_length"]))
    task = get_task(spec.get("task", "text-classification"))
    texts = read_texts(Path(args.texts), args.column)
    if not texts:
        raise SystemExit(f"{args.texts}: no rows in column {args.column!r}")
    began = time.perf_counter()
    batches = []
    for start in range(0, len(texts), args.batch_size):
        encoded = task.tokenize(tokenizer, texts[start : start + args.batch_size], {})
        batches.append({"input_ids": encoded.input_ids, "attention_mask": encoded.attention_mask})
    tokenize_us = (time.perf_counter() - began) / len(texts) * 1e6
    onnx, output = Path(args.onnx), spec["output_name"]
    served = {name: as_served(onnx, output, threads, count, batches, args.duration)
              for name, threads, count in layouts()}  # fmt: skip
    padded = {
        name: measure([make_session(onnx, threads) for _ in range(count)], output, batches,
                      args.duration)
        for name, threads, count in layouts()
    }  # fmt: skip
    best = max(served, key=lambda name: served[name]["sequences_per_s"])
    best_padded = max(padded, key=lambda name: padded[name]["sequences_per_s"])
    return {
        "rows": len(texts),
        "batch": args.batch_size,
        "rows_alone": backend_model.rows_alone(make_session(onnx, 1)),
        "layout": best,
        "layouts": {name: round(m["sequences_per_s"], 1) for name, m in served.items()},
        "tokenize_us_per_row": tokenize_us,
        **served[best],
        # The least CPU per row of either layout (not always the faster one's): what the
        # job's actors' CPU per row is held against.
        "least_cpu_ms_per_sequence": min(m["cpu_ms_per_sequence"] for m in served.values()),
        "padded": {"layout": best_padded, **padded[best_padded],
                   "layouts": {n: round(m["sequences_per_s"], 1) for n, m in padded.items()}},
    }  # fmt: skip


def layouts() -> list[tuple[str, int, int]]:
    """``(name, threads per session, sessions)``: a session with a thread per core, and
    (on more than one core) a session per core with one thread each."""
    cores = os.cpu_count() or 1
    found = [(f"1 session x {cores} threads", cores, 1)]
    if cores > 1:
        found.append((f"{cores} sessions x 1 thread", 1, cores))
    return found


def as_served(
    onnx: Path, output: str, threads: int, count: int,
    batches: list[dict[str, np.ndarray]], duration_s: float,
) -> dict[str, float]:  # fmt: skip
    """``batches`` through the serving code's session and call, ``count`` sessions of
    ``threads`` threads side by side."""
    providers = backend_model.providers(False)
    sessions = [backend_model.make_session(onnx, threads, providers, output) for _ in range(count)]
    alone = backend_model.rows_alone(sessions[0])

    def call(driver: int, run: int) -> int:
        feeds = batches[run % len(batches)]
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        backend_model.run(sessions[driver], output, ids, mask, rows_alone=alone)
        return len(ids)

    for session in sessions:
        for feeds in batches[:WARMUP_RUNS]:
            backend_model.run(session, output, feeds["input_ids"], feeds["attention_mask"],
                              rows_alone=alone)  # fmt: skip
    return drive_threads(count, call, duration_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--onnx", required=True, help="the served ONNX file")
    parser.add_argument("--tokenizer", required=True, help="folder holding tokenizer.json")
    parser.add_argument("--spec", required=True, help="the version's infergate.json")
    parser.add_argument("--texts", required=True, help="the batch cell's Parquet file")
    parser.add_argument("--column", default="text", help="its text column")
    parser.add_argument("--batch-size", type=int, default=32, help="rows per model call")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per layout")
    print(json.dumps(run(parser.parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
