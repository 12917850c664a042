"""Single texts of plain ASCII through kitoken's WordPiece, for BERT's tokenizers.

With BERT's normaliser out of the way on plain ASCII (``tokenization.ascii_twin``), the
``tokenizers`` library still spent most of a 16-text request's tokenizing on building an
``Encoding`` per text: a string per token, its offsets, word ids and masks, all turned
into Python objects. kitoken (BSD-2) reads the same ``tokenizer.json`` and returns the ids
alone; the template's special tokens, truncation and padding are added here. Tokenizing
16 texts of 16 tokens took 90-97 us of CPU instead of 370-390 for the library's encode
alone, one text 7 instead of 16 (2-core EPYC, in a loop).

Taken only where both agree: a BERT tokenizer (its normaliser, pre-tokenizer and
WordPiece model), texts that are plain ASCII (which the normaliser only lowercases),
encoded alone (no query: pairs keep the library's truncation of the longer side),
without offsets, and none holding an added token (the library matches a typed ``[CLS]``
as the special token, flagged special, which the unknown-token ratio leaves out). Every
tokenizer built is checked against the library on probe texts before it serves; one
that differs is not used (``build`` returns None), and
``tests/unit/serving/test_tokenization.py`` compares both on random ASCII.

What it costs: kitoken's copy of the vocabulary, about 7 MB more per tokenizer file a
replica serves (MiniLM's; one copy whatever the maximum length or the end cut), and a
tokenizer loads in about 80 ms instead of 40.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import string
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from kitoken import Kitoken
from tokenizers import Tokenizer

log = logging.getLogger(__name__)
# ids, attention mask, lengths, unknown-token ratios, cut or not (``tokenization.Batch``)
Figures = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]

BERT = {"normalizer": "BertNormalizer", "pre_tokenizer": "BertPreTokenizer", "model": "WordPiece"}
# BERT's: kitoken aborts the process on an empty one and misreads a lone "#" as one.
SUBWORD_PREFIX = "##"
# Checked against the library when a tokenizer is built: cases, every punctuation mark,
# digits, whitespace, words past WordPiece's 100 characters (unknown), nothing, texts of
# as many tokens as fit and one more (``_probes``), and a long text of varied words.
PROBES = (
    "Hello, World!",
    "",
    "   ",
    " ".join(string.punctuation) + string.punctuation,
    "It's 3.14 o'clock\tin the U.S.A.\r\nReally?!",
    "unbelievably antidisestablishmentarianism e-mail",
    "x" * 101,
    "x" * 120 + " y",
    " ".join(f"w{i} word{i % 7}" for i in range(300)),
)


class FastWordPiece:
    """Encodes batches of single plain-ASCII texts as ``tokenizer`` does with its
    truncation (``max_length``, cut at ``direction``) and right padding."""

    def __init__(
        self, vocabulary: _Vocabulary, tokenizer: Tokenizer, max_length: int, direction: str
    ):
        self._vocabulary = vocabulary  # held while this is
        self._kit = vocabulary.kit
        # The template's special tokens around a text, from the library itself.
        bare = tokenizer.encode("hello", add_special_tokens=False).ids
        whole = tokenizer.encode("hello").ids
        start = next(i for i in range(len(whole)) if whole[i : i + len(bare)] == bare)
        self._prefix = whole[:start]
        self._suffix = whole[start + len(bare) :]
        self._budget = max_length - len(self._prefix) - len(self._suffix)
        self._left = direction == "left"
        self._pad_id = tokenizer.padding["pad_id"] if tokenizer.padding else 0
        unk = getattr(tokenizer.model, "unk_token", None)
        self._unk_id = tokenizer.token_to_id(unk) if unk else None
        added = [token.content.lower() for token in tokenizer.get_added_tokens_decoder().values()]
        self._added = re.compile("|".join(map(re.escape, added))) if added else None

    @classmethod
    def build(
        cls,
        tokenizer: Tokenizer,
        max_length: int,
        direction: str,
        reference: Callable[[list[str]], Any],
        serialized: str | None = None,
    ) -> FastWordPiece | None:
        """The fast path for ``tokenizer`` (configured as it serves), or None: not a BERT
        tokenizer, one kitoken cannot read, or one whose figures differ from those of
        ``reference``'s batches (the library's) on the probe texts. ``serialized``:
        ``tokenizer.to_str()``, if the caller has it."""
        spec = json.loads(serialized or tokenizer.to_str())
        if any((spec.get(part) or {}).get("type") != kind for part, kind in BERT.items()):
            return None
        if spec["model"].get("continuing_subword_prefix") != SUBWORD_PREFIX:
            return None
        spec["padding"] = spec["truncation"] = None  # both done here, as configured
        content = json.dumps(spec).encode()
        key = hashlib.sha256(content).digest()
        try:
            with _LOADED_LOCK:  # one kitoken per vocabulary: cut at either end, any length
                vocabulary = _LOADED.get(key)
                if vocabulary is None:
                    vocabulary = _LOADED[key] = _Vocabulary(Kitoken.from_tokenizers(content))
            fast = cls(vocabulary, tokenizer, max_length, direction)
        except Exception as error:  # any refusal leaves the library's path
            log.info("no fast WordPiece path for this tokenizer: %s", error)
            return None
        if fast._budget < 1:  # not even one token of text fits
            return None
        # Each probe alone, and all in one batch (padded to the longest).
        probes = fast._probes()
        for batch in [[text] for text in probes] + [probes]:
            got, expected = fast.encode(batch), reference(batch)
            if got is None or not all(map(np.array_equal, got, expected.figures())):
                log.warning("kitoken encodes %r otherwise than the tokenizer", batch[0])
                return None
        return fast

    def _probes(self) -> list[str]:
        """``PROBES``, and texts of as many tokens as fit and of one more."""
        fits = " ".join(["word"] * self._budget)
        return [*PROBES, fits, fits + " word", fits + " !"]

    def encode(self, texts: Sequence[str]) -> Figures | None:
        """The figures of ``texts`` (each plain ASCII) as ``tokenization.Batch`` holds
        them, or None for no text or one holding an added token: the library's batches."""
        if not texts:
            return None
        added = self._added
        if added is not None and any(added.search(text.lower()) for text in texts):
            return None
        budget = self._budget
        rows = self._kit.encode_all(list(texts), False)
        truncated = [len(row) > budget for row in rows]
        if any(truncated):
            rows = [row[-budget:] if self._left else row[:budget] for row in rows]
        prefix, suffix = self._prefix, self._suffix
        ids = [prefix + row + suffix for row in rows]
        lengths = [len(text_ids) for text_ids in ids]
        width = max(lengths)
        if min(lengths) == width:  # one text, or texts as long as each other
            input_ids = np.array(ids, dtype=np.int64)
            attention_mask = np.ones_like(input_ids)
        else:
            input_ids = np.full((len(ids), width), self._pad_id, dtype=np.int64)
            for row, text_ids in zip(input_ids, ids, strict=True):
                row[: len(text_ids)] = text_ids
            attention_mask = (np.arange(width) < np.array(lengths)[:, None]).astype(np.int64)
        unk = self._unk_id
        unknown = [row.count(unk) / max(len(row), 1) if unk is not None else 0.0 for row in rows]
        return (
            input_ids,
            attention_mask,
            np.array(lengths, dtype=np.int64),
            np.array(unknown, dtype=np.float64),
            np.array(truncated, dtype=bool),
        )


class _Vocabulary:
    """A loaded kitoken, shared by every fast path made for the same tokenizer content
    (the other end to cut, another maximum length) while any of them holds it."""

    __slots__ = ("__weakref__", "kit")

    def __init__(self, kit: Kitoken) -> None:
        self.kit = kit


_LOADED: weakref.WeakValueDictionary[bytes, _Vocabulary] = weakref.WeakValueDictionary()
_LOADED_LOCK = threading.Lock()
