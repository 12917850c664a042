"""The reference texts of a registration: read from a file, and run through the graph
that will be served, tokenized and post-processed as the front-end does, for the drift
baseline (``infergate.observe.reference``)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from tqdm import tqdm

from infergate import tasks
from infergate.config import PROJECT_ROOT
from infergate.errors import RegistrationError
from infergate.observe.reference import reference_stats
from infergate.serving.tokenization import TextTokenizer
from infergate.tasks import Figures

DEFAULT_REFERENCE_TEXTS = PROJECT_ROOT / "registry" / "demo" / "sentiment.tsv"
REFERENCE_BATCH = 32


def read_texts(path: Path) -> list[str]:
    """One text per line, or a TSV/CSV whose header has a ``text`` column."""
    return read_inputs(path)[0]


def read_inputs(path: Path) -> tuple[list[str], list[str] | None]:
    """Texts, and their queries where a TSV/CSV has a ``query`` column too (text-ranking's
    reference pairs); else one text per line."""
    if not path.is_file():
        raise RegistrationError(f"reference texts file {path} does not exist")
    queries: list[str] | None = None
    if path.suffix in (".tsv", ".csv"):
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle, delimiter="\t" if path.suffix == ".tsv" else ",")
            fields = reader.fieldnames or []
            if "text" not in fields:
                raise RegistrationError(f"{path} has no 'text' column in its header")
            rows = [row for row in reader if row.get("text")]
            texts = [row["text"] for row in rows]
            if "query" in fields:
                queries = [row.get("query") or "" for row in rows]
    else:
        texts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not texts:
        raise RegistrationError(f"{path} holds no texts")
    return texts, queries


def reference_queries(texts: list[str], queries: list[str] | None) -> list[str]:
    """text-ranking's reference pairs: the file's queries, or else each text paired with
    the one before it (a stand-in: real queries make a better drift baseline)."""
    if queries is not None:
        return queries
    return [texts[i - 1] for i in range(len(texts))]


def run_reference(
    onnx_path: Path,
    tokenizer: TextTokenizer,
    task: str,
    output_name: str,
    labels: list[str],
    texts: list[str],
    progress: bool,
    queries: list[str] | None = None,
) -> dict:
    """Run the reference texts through the graph that will be served, tokenized and
    post-processed as the front-end does; summarise."""
    import onnxruntime as ort

    served = tasks.get(task)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    lengths, unknown, outputs, figures = [], [], [], []
    starts = range(0, len(texts), REFERENCE_BATCH)
    for start in tqdm(starts, desc="reference statistics", unit="batch", disable=not progress):
        chunk = texts[start : start + REFERENCE_BATCH]
        parameters = {"query": queries[start : start + REFERENCE_BATCH]} if queries else {}
        batch = served.tokenize(tokenizer, chunk, parameters)
        feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
        (out,) = session.run([output_name], feeds)
        _, raw = served.postprocess(out, batch, chunk, labels, {})
        lengths.append(batch.lengths)
        unknown.append(batch.unknown_ratio)
        figures.append(served.figures(raw, batch, labels))
        if served.centroid:
            outputs.append(raw)
    return reference_stats(
        task,
        np.concatenate(lengths),
        np.concatenate(unknown),
        np.concatenate(outputs) if outputs else np.zeros((0, 0)),
        labels,
        figures=Figures.concat(figures),
    )
