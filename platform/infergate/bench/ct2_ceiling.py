"""The translation ceiling: CTranslate2 in one process on the converted model infergate
serves, no server at all.

Run as ``python -m infergate.bench.ct2_ceiling`` by the task cells
(``infergate.bench.task_cells``) with the arguments of ``infergate.bench.ceiling``, whose
JSON document it prints in the same shape (a row per text length and batch size, each the
best of its layouts). ``--model`` is the served ``ctranslate2/model.bin``: the
``Translator`` loads its folder at the compute type a CPU serves the registered precision
with (``infergate.registration.ct2_export.CPU_COMPUTE_TYPES``), as Triton's model does
(``infergate.triton.translator_model``). Inputs are tokenized and mapped to the model's
token strings beforehand; every batch is decoded greedily (unless ``--parameters`` says
otherwise) to the same ``max_decoding_length`` as the requests of the cell, so that both
sides generate the same tokens.

Two layouts of the machine per batch size, the better one is the row: one translator
replica with a thread per core (``inter_threads=1``), and a replica per core with one
thread each (``inter_threads=cores``), driven by as many Python threads at once
(CTranslate2 releases the GIL).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from infergate.bench.ceiling import drive_threads
from infergate.bench.procfs import (
    keep_quietest,
    memory_by_component,
    snapshot,
    wait_for_quiet,
)
from infergate.bench.workload import PROBE_TEXTS, build_text_sets
from infergate.registration.ct2_export import CPU_COMPUTE_TYPES
from infergate.serving.tokenization import TextTokenizer
from infergate.tasks.translation import DEFAULT_BEAM_SIZE, DEFAULT_MAX_DECODING_LENGTH

BATCH_SIZES = (1, 16, 32)
WARMUP_RUNS = 2
MIN_RUNS = 3


def source_vocabulary(model_dir: Path) -> list[str]:
    """The tokens of a converted model's input ids, in id order (a shared vocabulary, or
    the source one of two), as Triton's model reads them."""
    for name in ("source_vocabulary.json", "shared_vocabulary.json"):
        path = model_dir / name
        if path.is_file():
            return list(json.loads(path.read_text()))
    raise FileNotFoundError(f"no source or shared vocabulary file in {model_dir}")


def make_translator(model_dir: Path, compute_type: str, replicas: int, threads: int) -> Any:
    import ctranslate2

    return ctranslate2.Translator(
        str(model_dir),
        device="cpu",
        compute_type=compute_type,
        inter_threads=replicas,
        intra_threads=threads,
    )


def token_batches(
    tokenizer: TextTokenizer, vocabulary: Sequence[str], texts: Sequence[str], batch_size: int
) -> list[list[list[str]]]:
    """``texts`` (cycled to fill the last batch) in batches of ``batch_size``, each text
    tokenized as the front-end does and mapped to the model's tokens, as Triton's model
    maps the ids it receives."""
    batches = []
    for start in range(0, len(texts), batch_size):
        chosen = (list(texts) * 2)[start : start + batch_size]
        batch = tokenizer(chosen)
        batches.append(
            [
                [vocabulary[i] for i in row[mask.astype(bool)].tolist()]
                for row, mask in zip(batch.input_ids, batch.attention_mask, strict=True)
            ]
        )
    return batches


def measure(
    translator: Any,
    drivers: int,
    batches: list[list[list[str]]],
    decoding: dict[str, int],
    duration_s: float,
) -> dict[str, Any]:
    """Translate the batches in turn for ``duration_s`` (at least ``MIN_RUNS`` runs per
    driver), ``drivers`` Python threads calling the translator at once."""
    for tokens in batches[:WARMUP_RUNS]:
        translator.translate_batch(tokens, **decoding)
    generated = [0] * drivers  # output tokens, per driver
    translated = [0] * drivers  # texts, per driver

    def call(driver: int, run: int) -> int:
        tokens = batches[(run * drivers + driver) % len(batches)]
        results = translator.translate_batch(tokens, **decoding)
        generated[driver] += sum(len(result.hypotheses[0]) for result in results)
        translated[driver] += len(tokens)
        return len(tokens)

    figures: dict[str, Any] = drive_threads(drivers, call, duration_s, MIN_RUNS)
    figures["output_tokens_mean"] = sum(generated) / sum(translated)
    return figures


def decoding_of(parameters: dict[str, Any], spec: dict[str, Any]) -> dict[str, int]:
    """``translate_batch``'s settings for requests with ``parameters``, the length capped
    as Triton's model caps it (``spec["max_decoding_length"]``)."""
    length = int(parameters.get("max_decoding_length", DEFAULT_MAX_DECODING_LENGTH))
    limit = int(spec.get("max_decoding_length") or 0)
    return {
        "beam_size": int(parameters.get("beam_size", DEFAULT_BEAM_SIZE)),
        "max_decoding_length": min(length, limit) if limit else length,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    spec = json.loads(Path(args.spec).read_text())
    model_dir = Path(args.model).parent
    tokenizer = TextTokenizer.from_dir(Path(args.tokenizer), int(spec["max_length"]))
    vocabulary = source_vocabulary(model_dir)
    decoding = decoding_of(json.loads(args.parameters), spec)
    compute_type = CPU_COMPUTE_TYPES[spec.get("precision", "int8")]
    cores = os.cpu_count() or 1
    threads = args.threads or cores
    layouts = {
        f"1 translator x {threads} threads": (
            make_translator(model_dir, compute_type, 1, threads),
            1,
        )
    }
    if cores > 1:
        layouts[f"{cores} replicas x 1 thread"] = (
            make_translator(model_dir, compute_type, cores, 1),
            cores,
        )
    text_sets = build_text_sets(Path(args.tokenizer), args.lengths)

    def settle() -> None:
        wait_for_quiet([], args.noisy_cpu_percent, args.quiet_wait)

    rows = []
    for tokens in args.lengths:
        pool = text_sets.by_tokens[tokens]
        for batch_size in BATCH_SIZES:
            batches = token_batches(tokenizer, vocabulary, pool, batch_size)
            measured = {
                name: keep_quietest(
                    partial(measure, translator, drivers, batches, decoding, args.duration),
                    args.noisy_cpu_percent, args.retries, settle,
                )
                for name, (translator, drivers) in layouts.items()
            }  # fmt: skip
            name = max(measured, key=lambda n: measured[n]["sequences_per_s"])
            figures = {
                **measured[name],
                "layout": name,
                "layouts": {n: round(f["sequences_per_s"], 1) for n, f in measured.items()},
            }
            rows.append({"tokens": tokens, "batch": batch_size, **figures})
            print(
                f"  ceiling  tokens={tokens:<4} batch={batch_size:<3} "
                f"{figures['sequences_per_s']:8.1f} seq/s  p50 {figures['p50_ms']:.1f} ms  "
                f"{figures['output_tokens_mean']:.1f} tokens out  other "
                f"{figures['other_cpu_percent']:.0f}%  {figures['layouts']}",
                file=sys.stderr,
                flush=True,
            )
        began = time.perf_counter()
        for start in range(0, len(pool), 32):
            tokenizer(pool[start : start + 32])
        rows[-1]["tokenize_us_per_sequence"] = (time.perf_counter() - began) / len(pool) * 1e6
    translator = next(iter(layouts.values()))[0]
    [probe] = token_batches(tokenizer, vocabulary, PROBE_TEXTS, len(PROBE_TEXTS))
    results = translator.translate_batch(probe, **decoding)
    return {
        "task": args.task,
        "engine": "ctranslate2",
        "compute_type": compute_type,
        "decoding": decoding,
        "threads": args.threads,
        "mean_tokens": text_sets.mean_tokens,
        "rows": rows,
        "probe_labels": None,  # not a classifier
        "probe_output_tokens": [len(result.hypotheses[0]) for result in results],
        "memory": memory_by_component(snapshot([os.getpid()])),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="the served ctranslate2/model.bin")
    parser.add_argument("--tokenizer", required=True, help="folder holding tokenizer.json")
    parser.add_argument("--spec", required=True, help="the version's infergate.json")
    parser.add_argument("--lengths", type=lambda s: [int(v) for v in s.split(",")], required=True)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    parser.add_argument("--threads", type=int, default=0, help="threads of one translator")
    parser.add_argument("--task", default="translation")
    parser.add_argument("--query", help="unused: the ONNX ceiling's argument")
    parser.add_argument("--parameters", default="{}", help="the requests' parameters, JSON")
    parser.add_argument("--retries", type=int, default=0, help="re-measure noisy rows")
    parser.add_argument(
        "--quiet-wait", type=float, default=0.0, help="before a retry, wait for a quiet box"
    )
    parser.add_argument(
        "--noisy-cpu-percent", type=float, default=10.0, help="other load that means noisy"
    )
    result = run(parser.parse_args(argv))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
