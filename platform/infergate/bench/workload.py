"""What is measured: the grid of cells, the texts sent, and the run profiles.

The grid is a subset of Infinity's benchmark grid: concurrency 1, 8 and 32; 1 and 16 texts
per request; texts of about 16 and 128 tokens (special tokens included, counted with the
served model's own tokenizer).
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from infergate.config import PROJECT_ROOT

SOURCE_TEXTS = PROJECT_ROOT / "registry" / "demo" / "sentiment.tsv"
DISTINCT_TEXTS = 64  # per length: enough that no two requests in a row are the same
PROBE_TEXTS = ("I love this film", "This is terrible")


@dataclass(frozen=True, order=True)
class Cell:
    """One point of the grid."""

    concurrency: int
    texts: int
    tokens: int

    @property
    def key(self) -> str:
        return f"c{self.concurrency}-t{self.texts}-n{self.tokens}"


@dataclass(frozen=True)
class Profile:
    """How long and on which cells one run measures."""

    name: str
    cells: tuple[Cell, ...]
    duration_s: float
    warmup_s: float
    ceiling_duration_s: float

    @property
    def token_lengths(self) -> tuple[int, ...]:
        return tuple(sorted({cell.tokens for cell in self.cells}))


def full_grid() -> tuple[Cell, ...]:
    return tuple(Cell(c, t, n) for n, t, c in itertools.product((16, 128), (1, 16), (1, 8, 32)))


# The cells the targets read are in every profile: (1, 1, 16) for latency, (32, 1, 16) and
# (32, 16, 16) for throughput.
TARGET_CELLS = (Cell(1, 1, 16), Cell(32, 1, 16), Cell(32, 16, 16))

PROFILES: dict[str, Profile] = {
    "full": Profile("full", full_grid(), duration_s=15.0, warmup_s=3.0, ceiling_duration_s=5.0),
    "quick": Profile(
        "quick",
        (*TARGET_CELLS, Cell(8, 1, 16), Cell(1, 1, 128), Cell(32, 1, 128)),
        duration_s=4.0,
        warmup_s=1.0,
        ceiling_duration_s=2.0,
    ),
    "smoke": Profile("smoke", TARGET_CELLS, duration_s=0.6, warmup_s=0.2, ceiling_duration_s=0.3),
}


def read_source_sentences(path: Path = SOURCE_TEXTS) -> list[str]:
    """The demo texts (``label<TAB>text``), used as the vocabulary of the benchmark texts."""
    with path.open(newline="", encoding="utf-8") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [row["text"].strip() for row in rows if (row.get("text") or "").strip()]


def texts_of_length(
    tokens: int,
    count_tokens: Callable[[str], int],
    sentences: Sequence[str],
    *,
    count: int = DISTINCT_TEXTS,
) -> list[str]:
    """``count`` distinct texts of exactly ``tokens`` tokens where the words allow it.

    Text ``i`` starts at sentence ``i`` and appends the following sentences' words until
    ``count_tokens(text)`` (special tokens included) reaches ``tokens``; a word that would
    overshoot is skipped, so lengths land on the target or one below it.
    """
    if tokens < 3:
        raise ValueError(f"tokens is {tokens}; expected at least 3 (two are special tokens)")
    words = [word for sentence in sentences for word in sentence.split()]
    if not words:
        raise ValueError("no source sentences to build texts from")
    starts = list(itertools.accumulate((len(s.split()) for s in sentences), initial=0))
    texts = []
    for i in range(count):
        start = starts[i % len(sentences)]
        chosen: list[str] = []
        for step in range(len(words)):
            word = words[(start + step) % len(words)]
            length = count_tokens(" ".join([*chosen, word]))
            if length <= tokens:  # else skip the word: a shorter one may still fit
                chosen.append(word)
                if length == tokens:
                    break
        texts.append(" ".join(chosen))
    return texts


@dataclass(frozen=True)
class TextSets:
    """Benchmark texts per target length, and their measured mean length."""

    by_tokens: dict[int, list[str]]
    mean_tokens: dict[int, float]

    def request_texts(self, cell: Cell, index: int) -> list[str]:
        """The texts of the ``index``-th distinct request of ``cell``."""
        pool = self.by_tokens[cell.tokens]
        return [pool[(index * cell.texts + j) % len(pool)] for j in range(cell.texts)]


def build_text_sets(tokenizer_dir: Path, lengths: Sequence[int]) -> TextSets:
    """Texts of each length in ``lengths``, measured with the served tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text).ids)

    sentences = read_source_sentences()
    by_tokens, mean_tokens = {}, {}
    for tokens in lengths:
        texts = texts_of_length(tokens, count_tokens, sentences)
        by_tokens[tokens] = texts
        mean_tokens[tokens] = sum(map(count_tokens, texts)) / len(texts)
    return TextSets(by_tokens, mean_tokens)
