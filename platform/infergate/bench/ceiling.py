"""The ceiling: ONNX Runtime in one process on the served ONNX file, no server at all.

Run as ``python -m infergate.bench.ceiling`` by the harness (its own process, so that its
threads and memory are its own); prints one JSON document. The session has the whole
machine: ONNX Runtime's defaults of one intra-op thread per core and spin-waiting between
operators, one inter-op thread and sequential execution as in the platform's Triton model
(``infergate/triton/backend_model.py``). The largest batch is also measured with a
session per core, one thread each, run side by side, and keeps the better of the two
layouts. Inputs are tokenized beforehand: the figures are the model's alone;
tokenization is timed apart and reported beside them. ``--task`` tokenizes as that task's
front-end does (a text-ranking model's inputs are ``(query, text)`` pairs), so that the
ceiling of every task cell (``infergate.bench.task_models``) is measured the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from infergate.bench.loadgen import percentile
from infergate.bench.procfs import (
    keep_quietest,
    memory_by_component,
    snapshot,
    system_busy_s,
    wait_for_quiet,
)
from infergate.bench.workload import PROBE_TEXTS, build_text_sets
from infergate.serving.tokenization import Batch, TextTokenizer
from infergate.tasks import get as get_task

BATCH_SIZES = (1, 16, 32)
WARMUP_RUNS = 3
MIN_RUNS = 5


def make_session(onnx_path: Path, intra_op_threads: int, spinning: bool = True) -> Any:
    """An ONNX Runtime session for a transformer graph (no parallel branches).
    ``spinning=False`` as in the platform's Triton model, for a session sharing the cores."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(
        str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
    )


def measure(
    sessions: list[Any], output: str, batches: list[dict[str, np.ndarray]], duration_s: float
) -> dict[str, float]:
    """Run the feeds in ``batches`` in turn for ``duration_s`` (at least ``MIN_RUNS`` runs
    each), every session in a thread of its own (ONNX Runtime releases the GIL)."""
    for session in sessions:
        for feeds in batches[:WARMUP_RUNS]:
            session.run([output], feeds)

    def call(driver: int, run: int) -> int:
        feeds = batches[run % len(batches)]
        sessions[driver].run([output], feeds)
        return len(feeds["input_ids"])

    return drive_threads(len(sessions), call, duration_s)


def drive_threads(
    drivers: int, call: Callable[[int, int], int], duration_s: float, min_runs: int = MIN_RUNS
) -> dict[str, float]:
    """``call(driver, run)`` over and over from ``drivers`` threads for ``duration_s`` (at
    least ``min_runs`` runs each), each call returning the rows it did: throughput,
    latency percentiles, CPU per row and the other load on the box meanwhile."""
    runs: list[list[float]] = [[] for _ in range(drivers)]
    done_rows = [0] * drivers
    deadline = time.perf_counter() + duration_s

    def drive(index: int) -> None:
        latencies = runs[index]
        while len(latencies) < min_runs or time.perf_counter() < deadline:
            began = time.perf_counter()
            done_rows[index] += call(index, len(latencies))
            latencies.append((time.perf_counter() - began) * 1e3)

    cpu, busy, began_all = time.process_time(), system_busy_s(), time.perf_counter()
    threads = [threading.Thread(target=drive, args=(i,)) for i in range(1, drivers)]
    for thread in threads:
        thread.start()
    drive(0)
    for thread in threads:
        thread.join()
    wall_s = time.perf_counter() - began_all
    ordered = sorted(latency for latencies in runs for latency in latencies)
    # Everything else the box did meanwhile, in percent of one core: a noise indicator.
    own_cpu_s = time.process_time() - cpu
    other = (system_busy_s() - busy) - own_cpu_s
    rows = sum(done_rows)
    return {
        "cpu_ms_per_sequence": 1e3 * own_cpu_s / rows,
        "other_cpu_percent": round(100 * max(other, 0.0) / wall_s, 1),
        "runs": len(ordered),
        "sequences_per_s": rows / wall_s,
        "p50_ms": percentile(ordered, 50),
        "p95_ms": percentile(ordered, 95),
        "p99_ms": percentile(ordered, 99),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    spec = json.loads(Path(args.spec).read_text())
    tokenizer = TextTokenizer.from_dir(Path(args.tokenizer), int(spec["max_length"]))
    task = get_task(args.task)
    parameters = {"query": args.query} if args.query else {}

    def encode(texts: list[str]) -> Batch:
        return task.tokenize(tokenizer, texts, parameters)

    cores = os.cpu_count() or 1
    # Two layouts of the machine, the better one is the ceiling of the largest batch: one
    # session with a thread per core, or a session per core with one thread each (which
    # is how Triton runs the platform's model; it did more on this box in some runs).
    session = make_session(Path(args.onnx), args.threads)
    layouts = {f"1 session x {args.threads or cores} threads": [session]}
    if cores > 1:
        layouts[f"{cores} sessions x 1 thread"] = [
            make_session(Path(args.onnx), 1) for _ in range(cores)
        ]
    output = spec["output_name"]
    text_sets = build_text_sets(Path(args.tokenizer), args.lengths)

    def settle() -> None:  # at least a second, so a burst of other load may pass
        wait_for_quiet([], args.noisy_cpu_percent, args.quiet_wait)

    def best_layout(batches: list[dict[str, np.ndarray]], candidates: list[str]) -> dict:
        measured = {}
        for name in candidates:
            measured[name] = keep_quietest(
                partial(measure, layouts[name], output, batches, args.duration),
                args.noisy_cpu_percent, args.retries, settle,
            )  # fmt: skip
        name = max(measured, key=lambda n: measured[n]["sequences_per_s"])
        seq_per_s = {n: round(figures["sequences_per_s"], 1) for n, figures in measured.items()}
        return {**measured[name], "layout": name, "layouts": seq_per_s}

    rows = []
    for tokens in args.lengths:
        pool = text_sets.by_tokens[tokens]
        for batch_size in BATCH_SIZES:
            batches = []
            for start in range(0, len(pool), batch_size):
                chosen = (pool * 2)[start : start + batch_size]
                encoded = encode(chosen)
                batches.append(
                    {"input_ids": encoded.input_ids, "attention_mask": encoded.attention_mask}
                )
            largest = batch_size == BATCH_SIZES[-1]
            figures = best_layout(batches, list(layouts) if largest else list(layouts)[:1])
            rows.append({"tokens": tokens, "batch": batch_size, **figures})
            print(
                f"  ceiling  tokens={tokens:<4} batch={batch_size:<3} "
                f"{figures['sequences_per_s']:8.1f} seq/s  p50 {figures['p50_ms']:.2f} ms  "
                f"other {figures['other_cpu_percent']:.0f}% ({figures['attempts']} attempt(s))"
                f"  {figures['layouts']}",
                file=sys.stderr,
                flush=True,
            )
        began = time.perf_counter()
        for start in range(0, len(pool), 32):
            encode(pool[start : start + 32])
        tokenize_us = (time.perf_counter() - began) / len(pool) * 1e6
        rows[-1]["tokenize_us_per_sequence"] = tokenize_us
    probe = encode(list(PROBE_TEXTS))
    (logits,) = session.run(
        [output], {"input_ids": probe.input_ids, "attention_mask": probe.attention_mask}
    )
    labels = spec.get("labels") or []
    probe_labels = None  # only a classifier's argmax is a label
    if task.name == "text-classification":
        probe_labels = [labels[i] if labels else int(i) for i in logits.argmax(axis=-1)]
    return {
        "task": task.name,
        "threads": args.threads,
        "mean_tokens": text_sets.mean_tokens,
        "rows": rows,
        "probe_labels": probe_labels,
        "memory": memory_by_component(snapshot([os.getpid()])),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--onnx", "--model", dest="onnx", required=True, help="the ONNX file")
    parser.add_argument("--tokenizer", required=True, help="folder holding tokenizer.json")
    parser.add_argument("--spec", required=True, help="the version's infergate.json")
    parser.add_argument("--lengths", type=lambda s: [int(v) for v in s.split(",")], required=True)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads")
    parser.add_argument("--task", default="text-classification", help="tokenize as this task")
    parser.add_argument("--query", help="text-ranking: the query each text is paired with")
    parser.add_argument("--retries", type=int, default=0, help="re-measure noisy rows")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        help="before a retry, wait (up to this long) for a quiet box",
    )
    parser.add_argument(
        "--noisy-cpu-percent", type=float, default=10.0, help="other load that means noisy"
    )
    result = run(parser.parse_args(argv))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
