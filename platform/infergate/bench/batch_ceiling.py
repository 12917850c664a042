"""The batch cell's ceiling: ONNX Runtime in one process on the served file, over the very
texts of the batch cell's input file, at its batch size.

Run as ``python -m infergate.bench.batch_ceiling`` by the batch cell
(``infergate.bench.batch_cell``), in a process of its own as the main ceiling is
(``infergate.bench.ceiling``, whose sessions and measuring loop it uses); prints one JSON
document. The texts are tokenized beforehand, as there: the figure is the model's alone,
and tokenizing is timed apart. Both layouts of the machine (one session with a thread per
core, a session per core with one thread each) are measured and the better one kept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from infergate.bench.ceiling import make_session, measure
from infergate.serving.tokenization import TextTokenizer
from infergate.tasks import get as get_task


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
    cores = os.cpu_count() or 1
    layouts = {f"1 session x {cores} threads": [make_session(Path(args.onnx), cores)]}
    if cores > 1:
        layouts[f"{cores} sessions x 1 thread"] = [
            make_session(Path(args.onnx), 1) for _ in range(cores)
        ]
    measured = {
        name: measure(sessions, spec["output_name"], batches, args.duration)
        for name, sessions in layouts.items()
    }
    best = max(measured, key=lambda name: measured[name]["sequences_per_s"])
    return {
        "rows": len(texts),
        "batch": args.batch_size,
        "layout": best,
        "layouts": {name: round(m["sequences_per_s"], 1) for name, m in measured.items()},
        "tokenize_us_per_row": tokenize_us,
        **measured[best],
    }


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
