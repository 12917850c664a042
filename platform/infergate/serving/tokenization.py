"""Batched tokenization for the front-end replicas, with the statistics drift needs.

Uses the Rust ``tokenizers`` library directly (the same engine as transformers'
fast tokenizers, without the Python wrapper's per-call overhead); a batch of lone
plain-ASCII texts for a BERT tokenizer goes through kitoken's WordPiece instead
(``infergate.serving.fast_wordpiece``), which gives the same figures for less.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, normalizers

from infergate.errors import InvalidInput
from infergate.serving.fast_wordpiece import FastWordPiece


def tokenize_serially() -> None:
    """Encode batches on the calling thread in this process.

    By default ``encode_batch`` spreads a batch over a thread per core. A front-end replica
    holds half a core beside Triton's model threads, and there the spread costs CPU it
    does not give back in time: 16 texts took 330 us of CPU on one thread and 500 us spread
    over two (2-core machine, same wall time). Read by the library at every call.

    The stack, the Helm chart and the Compose file start Ray's workers with the variable
    set already; then this writes nothing (a process writing its environment while other
    threads read theirs is best avoided).
    """
    if os.environ.get("TOKENIZERS_PARALLELISM") != "false":
        os.environ["TOKENIZERS_PARALLELISM"] = "false"


# Which end of a text too long for the model is cut (the ``tokenizers`` library's names).
RIGHT = "right"  # keeps the start: the default
LEFT = "left"  # keeps the end
DIRECTIONS = (RIGHT, LEFT)
# The request parameter naming it (TEI's ``truncation_direction``; its parsers set it).
TRUNCATION_DIRECTION = "truncation_direction"


def split_direction(parameters: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The end a request's texts are cut at (``RIGHT`` unless it asks), and its other
    parameters."""
    rest = {key: value for key, value in parameters.items() if key != TRUNCATION_DIRECTION}
    direction = parameters.get(TRUNCATION_DIRECTION, RIGHT)
    if direction not in DIRECTIONS:
        raise InvalidInput(
            f"'{TRUNCATION_DIRECTION}' {direction!r} is not one of {list(DIRECTIONS)}",
            param=TRUNCATION_DIRECTION,
        )
    return direction, rest


@dataclass(frozen=True)
class Batch:
    """Token ids padded to the longest text of the batch, and per-text figures."""

    input_ids: np.ndarray  # int64 [batch, sequence]
    attention_mask: np.ndarray  # int64 [batch, sequence]
    lengths: np.ndarray  # int64 [batch]: tokens per text, special tokens included
    unknown_ratio: np.ndarray  # float64 [batch]: unknown tokens / non-special tokens
    truncated: np.ndarray  # bool [batch]: the text was longer than max_length
    # With ``offsets=True`` only (token classification): each token's character span
    # [start, end) in its text, int64 [batch, sequence, 2]; special tokens and padding
    # (1 in ``special``) have (0, 0). ``word_ids``: each token's word, None for specials.
    offsets: np.ndarray | None = None
    special: np.ndarray | None = None
    word_ids: list[list[int | None]] | None = None

    def figures(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What every batch has: ids, mask, lengths, unknown-token ratios, cut or not."""
        return (
            self.input_ids, self.attention_mask, self.lengths, self.unknown_ratio, self.truncated
        )  # fmt: skip


@dataclass(frozen=True)
class Token:
    """One token of a text: its id, the text it stands for (a special token's own name),
    and that text's character span, None for special tokens."""

    id: int
    text: str
    special: bool
    start: int | None
    end: int | None


# ASCII's tab, line feed and carriage return: whitespace to BERT's normaliser; every other
# ASCII control character it deletes.
_WHITESPACE_CONTROLS = str.maketrans("", "", "\t\n\r")


def plain_ascii(text: str) -> bool:
    """``text`` is ASCII with no control character but tab, line feed and return: what
    BERT's normaliser changes in it is its case, and nothing else."""
    return text.isascii() and (
        text.isprintable() or text.translate(_WHITESPACE_CONTROLS).isprintable()
    )


def ascii_twin(tokenizer: Tokenizer, serialized: str | None = None) -> Tokenizer | None:
    """A copy of a BERT tokenizer whose normaliser only lowercases (if the original
    does), for texts where :func:`plain_ascii` holds; None for other tokenizers.

    BERT's normaliser (``BertNormalizer``) cleans control characters out, spaces Chinese
    characters, strips accents by Unicode decomposition and lowercases, tracking where
    every character of the text went. On plain ASCII all but the lowercasing leave the
    text as it is (tab, line feed and return become spaces, which the pre-tokenizer
    splits on like them), yet it is the dearest step of the encoding: tokenizing 16 texts
    of 16 tokens took 450 us of CPU with it and 330 with the lowercasing alone, one text 39
    and 25 (2-core EPYC); a replica's request path flat out, 834-942 us a request of 16
    texts against 929-1,047 (``bench.request_cpu``, both trees at once, three rounds).
    Ids, masks, offsets and truncation are equal
    (``tests/unit/serving/test_tokenization.py`` compares them on random ASCII).
    Not for a tokenizer with an added token matched after normalising that holds
    whitespace (the spaces the original makes of tabs would be seen) or a character
    outside ASCII (the original strips its accents, and finds it in unaccented text).

    The twin is a second copy of the tokenizer: for MiniLM's vocabulary about 6 MB more
    per tokenizer file a replica serves (versions with the same file share one,
    :meth:`TextTokenizer.shared`), and a tokenizer loads in about 43 ms instead of 15."""
    serialized = serialized or tokenizer.to_str()  # given: read once for both fast paths
    spec = json.loads(serialized)
    normalizer = spec.get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer":
        return None
    added = spec.get("added_tokens") or []
    if any(t.get("normalized") and not _same_in_twin(t["content"]) for t in added):
        return None
    twin = Tokenizer.from_str(serialized)
    lowercase = normalizers.Lowercase() if normalizer.get("lowercase", True) else None
    twin.normalizer = lowercase or normalizers.Sequence([])
    return twin


def _same_in_twin(content: str) -> bool:
    """An added token matched after normalising is matched by the twin as by the original."""
    return content.isascii() and content.isprintable() and not any(map(str.isspace, content))


_SHARED: weakref.WeakValueDictionary[tuple[bytes, int], TextTokenizer] = (
    weakref.WeakValueDictionary()
)
_SHARED_LOCK = threading.Lock()


class TextTokenizer:
    """Wraps a ``tokenizer.json`` with truncation to the model's max length."""

    def __init__(self, tokenizer: Tokenizer, max_length: int, direction: str = RIGHT) -> None:
        self._tokenizer = tokenizer
        self.max_length = max_length
        self.direction = direction
        tokenizer.enable_truncation(max_length=max_length, direction=direction)
        pad_id = tokenizer.padding["pad_id"] if tokenizer.padding else 0
        pad_token = tokenizer.id_to_token(pad_id) or "[PAD]"
        tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
        unk_token = getattr(tokenizer.model, "unk_token", None)
        self._unk_id = tokenizer.token_to_id(unk_token) if unk_token else None
        serialized = tokenizer.to_str()  # as configured
        self._ascii = ascii_twin(tokenizer, serialized)  # for batches of plain ASCII
        # ... and, alone and without offsets, kitoken's ids (checked against the library)
        self._fast = (
            FastWordPiece.build(tokenizer, max_length, direction, self._library, serialized)
            if self._ascii is not None
            else None
        )
        self._other_side: TextTokenizer | None = None  # cutting(): made on first use

    def cutting(self, direction: str) -> TextTokenizer:
        """This tokenizer with texts cut at ``direction`` ("left" keeps a long text's end,
        "right" its start). A tokenizer is shared by every request to its version, and
        the library keeps the side in the tokenizer itself, so the other side is a copy
        of its own, made once, rather than a setting changed per request."""
        if direction == self.direction:
            return self
        if direction not in DIRECTIONS:
            raise ValueError(f"direction {direction!r} is not one of {DIRECTIONS}")
        other = self._other_side
        if other is None:
            copy = Tokenizer.from_str(self._tokenizer.to_str())
            other = TextTokenizer(copy, self.max_length, direction)
            other._other_side = self
            self._other_side = other
        return other

    @classmethod
    def from_dir(cls, path: Path, max_length: int) -> TextTokenizer:
        return cls(Tokenizer.from_file(str(Path(path) / "tokenizer.json")), max_length)

    @classmethod
    def shared(cls, path: Path, max_length: int) -> TextTokenizer:
        """``from_dir``'s tokenizer, one per file content and max length in this process
        for as long as anything holds it. Versions of one model mostly carry the same
        ``tokenizer.json`` (and copies of one model the same), so a replica holds one
        tokenizer and one ASCII twin for all of them instead of a pair per version; a
        tokenizer is never changed once made, so sharing it changes no answer."""
        content = (Path(path) / "tokenizer.json").read_bytes()
        key = (hashlib.sha256(content).digest(), max_length)
        with _SHARED_LOCK:  # versions load in threads
            tokenizer = _SHARED.get(key)
            if tokenizer is None:
                tokenizer = cls(Tokenizer.from_str(content.decode()), max_length)
                _SHARED[key] = tokenizer
        return tokenizer

    def decode_batch(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """Texts of token ids, special tokens left out unless asked (translation's outputs)."""
        return list(self._tokenizer.decode_batch(ids, skip_special_tokens=skip_special_tokens))

    def tokens(self, texts: list[str], add_special_tokens: bool = True) -> list[list[Token]]:
        """Each text's tokens as the model sees them (truncated at ``max_length``), with
        the span of the text each stands for."""
        found = []
        for text in texts:
            encoding = self._tokenizer.encode(text, add_special_tokens=add_special_tokens)
            spans = zip(
                encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets,
                strict=True,
            )  # fmt: skip
            found.append(
                [
                    Token(id, token, True, None, None)
                    if special
                    else Token(id, text[start:end], False, start, end)
                    for id, token, special, (start, end) in spans
                ]
            )
        return found

    def __call__(
        self,
        texts: list[str],
        *,
        query: str | Sequence[str] | None = None,
        offsets: bool = False,
    ) -> Batch:
        """Encode ``texts``, each as the pair ``(query, text)`` when a query is given (one
        for all, or one per text), with the tokenizer's own pair template and truncation
        (longest first, as transformers')."""
        fast = self._fast
        if fast is not None and query is None and not offsets and all(map(plain_ascii, texts)):
            figures = fast.encode(texts)
            if figures is not None:
                return Batch(*figures)
        return self._library(texts, query, offsets)

    def _library(
        self,
        texts: list[str],
        query: str | Sequence[str] | None = None,
        offsets: bool = False,
    ) -> Batch:
        """``__call__`` by the ``tokenizers`` library (the twin for plain ASCII)."""
        inputs: list[Any] = list(texts)
        if isinstance(query, str):
            inputs = [(query, text) for text in texts]
        elif query is not None:
            inputs = list(zip(query, texts, strict=True))
        tokenizer = self._tokenizer
        if self._ascii is not None and self._plain(texts, query):
            tokenizer = self._ascii
        # The fast variant skips character offsets, which only token classification reads:
        # 16 texts encode in 320 us of CPU instead of 383 us.
        encode = tokenizer.encode_batch if offsets else tokenizer.encode_batch_fast
        encodings = encode(inputs)
        ids = [e.ids for e in encodings]
        masks = [e.attention_mask for e in encodings]
        input_ids = np.array(ids, dtype=np.int64)
        attention_mask = np.array(masks, dtype=np.int64)
        # The per-text figures counted on the lists, not by numpy over the padded arrays:
        # a single text's tokenization took 26.8 us of CPU instead of 35.9. ``__init__``
        # pads on the right, so a text's own tokens are the first ``length`` of its row
        # (its padding, flagged special too, is left out so).
        lengths = [mask.count(1) for mask in masks]
        unknown = []
        for encoding, text_ids, length in zip(encodings, ids, lengths, strict=True):
            content = max(length - encoding.special_tokens_mask[:length].count(1), 1)
            unknowns = 0 if self._unk_id is None else text_ids[:length].count(self._unk_id)
            unknown.append(unknowns / content)
        figures = (
            input_ids,
            attention_mask,
            np.array(lengths, dtype=np.int64),
            np.array(unknown, dtype=np.float64),
            np.array([bool(e.overflowing) for e in encodings]),
        )
        if not offsets:
            return Batch(*figures)
        special = np.array([e.special_tokens_mask for e in encodings], dtype=np.int64)
        spans = np.array([e.offsets for e in encodings], dtype=np.int64).reshape(
            len(encodings), input_ids.shape[1], 2
        )
        words = [list(e.word_ids) for e in encodings]
        return Batch(*figures, spans, special, words)

    @staticmethod
    def _plain(texts: list[str], query: str | Sequence[str] | None) -> bool:
        """Every text of the batch, and its query, is plain ASCII (one text that is not
        sends the whole batch through the original normaliser)."""
        if not all(map(plain_ascii, texts)):
            return False
        if query is None:
            return True
        return plain_ascii(query) if isinstance(query, str) else all(map(plain_ascii, query))
