"""The ``sentiment`` demo model: all-MiniLM-L6-v2 fine-tuned on ``registry/demo/sentiment.tsv``.

The result is a standard Hugging Face ``BertForSequenceClassification`` folder (labels
``negative``/``positive``) that ``AutoModelForSequenceClassification`` loads and
:mod:`infergate.registration.onnx_export` exports.

Why the top three encoder layers are trained, not only the head: that model classifies from
the pooler (CLS token -> dense -> tanh), and all-MiniLM was trained with mean pooling, so its
CLS state carries little sentiment. Measured on 80/20 splits of the 406 rows: a pooler and
classifier trained on frozen CLS states reached 0.79 held-out accuracy (mean of 8 splits; a
linear head on frozen mean-pooled features 0.86). Training the top three of six layers as
well reached 0.92 (min 0.90, seeds 0-5) in about 9 s on 2 cores; the embeddings and the lower
three layers stay frozen, which halves the backward pass.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch
import transformers
from tqdm import tqdm

from infergate.config import PROJECT_ROOT
from infergate.registration.hf_folder import transformers_quiet

log = logging.getLogger(__name__)

LABELS = ("negative", "positive")
HELDOUT_FRACTION = 0.2
TRAINED_TOP_LAYERS = 3
EPOCHS = 3
BATCH_SIZE = 16
LEARNING_RATE = 1e-4
MAX_LENGTH = 128
# Trained folders kept by what they were trained from: `infergate up --demo` on a fresh
# store and the benchmark's model train the same weights, 10-60 s each time here.
TRAINED_CACHE = PROJECT_ROOT / ".infergate" / "trained"


@dataclass(frozen=True)
class SentimentTraining:
    """A trained sentiment model folder and how well it did on held-out rows."""

    model_dir: Path
    heldout_accuracy: float
    n_train: int
    n_heldout: int
    train_seconds: float


def build_sentiment_model(
    encoder_dir: Path,
    data_file: Path,
    out_dir: Path,
    *,
    seed: int = 0,
    progress: bool = True,
    cache_dir: Path = TRAINED_CACHE,
) -> Path:
    """Train the ``sentiment`` model and save it at ``out_dir``; return ``out_dir``.

    A folder trained before from the same encoder, data, seed, code and library versions
    is copied from ``cache_dir`` instead (and a new one kept there, where it can be
    written). See :func:`train_sentiment_model` for the held-out accuracy.
    """
    cached = Path(cache_dir) / f"sentiment-{_inputs_key(Path(encoder_dir), Path(data_file), seed)}"
    if cached.is_dir():
        log.info("sentiment model: trained before, copied from %s", cached)
        shutil.copytree(cached, out_dir, dirs_exist_ok=True)
        return Path(out_dir)
    trained = train_sentiment_model(encoder_dir, data_file, out_dir, seed=seed, progress=progress)
    _keep(trained.model_dir, cached)
    return trained.model_dir


def _inputs_key(encoder_dir: Path, data_file: Path, seed: int) -> str:
    """A digest of everything training reads: the encoder's files, the data, the seed,
    this module's code and the versions of the libraries that run it."""
    versions = (torch.__version__, transformers.__version__, tokenizers.__version__)
    digest = hashlib.sha256(f"{seed} {versions}".encode())
    named = [("code", Path(__file__)), ("data", data_file)] + [
        (str(p.relative_to(encoder_dir)), p) for p in sorted(encoder_dir.rglob("*")) if p.is_file()
    ]
    for name, path in named:  # each file's name and size before its bytes: no two inputs alike
        digest.update(f"{name}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()[:16]


def _keep(model_dir: Path, cached: Path) -> None:
    """Copy a trained folder into the cache whole (renamed into place), or not at all."""
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cached.parent) as tmp:
            shutil.copytree(model_dir, Path(tmp) / "model")
            (Path(tmp) / "model").rename(cached)
    except OSError as e:  # read-only, full, or another process kept it first
        log.debug("sentiment model not cached at %s: %s", cached, e)


def train_sentiment_model(
    encoder_dir: Path, data_file: Path, out_dir: Path, *, seed: int = 0, progress: bool = True
) -> SentimentTraining:
    """Fine-tune the BERT encoder in ``encoder_dir`` on ``data_file`` (``label<TAB>text``).

    A stratified ``HELDOUT_FRACTION`` of each label, drawn with ``seed``, is held out and
    scored after training. Deterministic for a given seed on a given machine.
    """
    start = time.perf_counter()
    train_rows, heldout_rows = _split(_read_rows(Path(data_file)), seed)
    torch.manual_seed(seed)
    with transformers_quiet(not progress):
        tokenizer = transformers.AutoTokenizer.from_pretrained(encoder_dir, local_files_only=True)
        model, info = transformers.BertForSequenceClassification.from_pretrained(
            encoder_dir,
            local_files_only=True,
            num_labels=len(LABELS),
            id2label=dict(enumerate(LABELS)),
            label2id={label: i for i, label in enumerate(LABELS)},
            attn_implementation="eager",
            dtype=torch.float32,
            output_loading_info=True,
        )
    # Only the new head may be missing; anything else means a wrong or broken encoder.
    unexpected_missing = sorted(k for k in info["missing_keys"] if not k.startswith("classifier."))
    if unexpected_missing:
        raise ValueError(f"{encoder_dir} is not a BERT encoder: missing {unexpected_missing[:4]}")
    _freeze_lower_layers(model)

    def encode(rows: list[tuple[int, str]]) -> dict[str, torch.Tensor]:
        texts = [text for _, text in rows]
        return tokenizer(
            texts, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt"
        )

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LEARNING_RATE)
    order = torch.Generator().manual_seed(seed)
    n_batches = (len(train_rows) + BATCH_SIZE - 1) // BATCH_SIZE
    model.train()
    with tqdm(
        total=EPOCHS * n_batches, desc="sentiment", file=sys.stderr, disable=not progress
    ) as bar:
        for _ in range(EPOCHS):
            for i in torch.randperm(len(train_rows), generator=order).split(BATCH_SIZE):
                batch = [train_rows[j] for j in i.tolist()]
                labels = torch.tensor([label for label, _ in batch])
                optimizer.zero_grad()
                loss = model(**encode(batch), labels=labels).loss
                loss.backward()
                optimizer.step()
                bar.set_postfix(loss=f"{loss.item():.3f}")
                bar.update()
    model.eval()
    accuracy = _accuracy(model, encode, heldout_rows)
    train_seconds = time.perf_counter() - start

    out_dir = Path(out_dir)
    with transformers_quiet(not progress):
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    log.info(
        "sentiment model: held-out accuracy %.3f on %d rows (trained on %d) in %.1f s -> %s",
        accuracy,
        len(heldout_rows),
        len(train_rows),
        train_seconds,
        out_dir,
    )
    return SentimentTraining(out_dir, accuracy, len(train_rows), len(heldout_rows), train_seconds)


def _read_rows(data_file: Path) -> list[tuple[int, str]]:
    with data_file.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        if reader.fieldnames != ["label", "text"]:
            raise ValueError(f"{data_file} must start with the header 'label<TAB>text'")
        rows = []
        for line, row in enumerate(reader, start=2):
            if row["label"] not in LABELS or not (row["text"] or "").strip():
                raise ValueError(f"{data_file}:{line}: expected a label in {LABELS} and a text")
            rows.append((LABELS.index(row["label"]), row["text"].strip()))
    return rows


def _split(
    rows: list[tuple[int, str]], seed: int
) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """Stratified shuffle split: the file is grouped by label, so split each label alike."""
    rng = random.Random(seed)
    train, heldout = [], []
    for label in range(len(LABELS)):
        group = [row for row in rows if row[0] == label]
        rng.shuffle(group)
        cut = round(len(group) * HELDOUT_FRACTION)
        heldout += group[:cut]
        train += group[cut:]
    if not heldout or not train:
        raise ValueError(f"too few rows to hold out {HELDOUT_FRACTION:.0%} of each label")
    return train, heldout


def _freeze_lower_layers(model: transformers.BertForSequenceClassification) -> None:
    bert = model.bert
    frozen = [
        bert.embeddings,
        *bert.encoder.layer[: max(0, len(bert.encoder.layer) - TRAINED_TOP_LAYERS)],
    ]
    for module in frozen:
        module.requires_grad_(False)


def _accuracy(model: torch.nn.Module, encode, rows: list[tuple[int, str]]) -> float:
    correct = 0
    with torch.no_grad():
        for start in range(0, len(rows), 64):
            batch = rows[start : start + 64]
            predicted = model(**encode(batch)).logits.argmax(dim=-1)
            correct += int((predicted == torch.tensor([label for label, _ in batch])).sum())
    return correct / len(rows)
