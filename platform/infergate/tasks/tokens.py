"""token-classification (named entities): a label per token, grouped into entities.

The graph outputs each token's logits, ``[batch, sequence, labels]``; the front-end
turns them into entities with the aggregation strategies of transformers'
token-classification pipeline (its ``AggregationStrategy``: the same rules, written
here from its documented behaviour):

- ``none``: one entity per token that is not ``O``: its label and probability.
- ``simple``: tokens in a row whose labels continue one entity (``B-X`` then ``I-X``...,
  or equal labels without a B-/I- prefix) form one entity of type ``X``, scored by the
  mean of their probabilities.
- ``first`` / ``max`` / ``average``: first each word takes one label, from its first
  token, from its most confident token, or from the mean of its tokens' probabilities;
  then words are grouped as in ``simple``.

Entities are ``{"entity", "score", "start", "end", "word"}`` (``none`` adds the token's
``index``); ``entity`` is the token's label with ``none`` and the entity type otherwise
(the pipeline's ``entity_group``). ``start``/``end`` are character offsets into the text
as sent, from the fast tokenizer's offsets, and ``word`` is exactly ``text[start:end]``
(the pipeline instead joins the tokens, lower-cased by an uncased tokenizer). Words are
the tokenizer's words (its ``word_ids``), where the pipeline guesses words from spaces
for tokenizers without a continuing-subword prefix (BPE). Pipeline reference:
https://huggingface.co/docs/transformers/main_classes/pipelines#transformers.TokenClassificationPipeline
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from infergate.errors import InvalidInput
from infergate.observe import metrics as m
from infergate.serving.postprocess import softmax
from infergate.serving.tokenization import Batch, TextTokenizer
from infergate.tasks import Figures, Paired, Task, agreeing, heads

if TYPE_CHECKING:
    from infergate.serving.runtime import Prediction

STRATEGIES = ("none", "simple", "first", "max", "average")
DEFAULT_STRATEGY = "simple"
OUTSIDE = "O"  # the label of tokens outside any entity (the pipeline's ignore_labels)


def entity_type(label: str) -> str:
    """``B-PER`` and ``I-PER`` -> ``PER``; a label without a prefix is its own type."""
    return label.split("-", 1)[-1]


def _bio(label: str) -> tuple[str, str]:
    """(B or I, type); a label without a B-/I- prefix continues what precedes it."""
    if label.startswith("B-"):
        return "B", label[2:]
    if label.startswith("I-"):
        return "I", label[2:]
    return "I", label


def entity_types(labels: Sequence[str]) -> tuple[str, ...]:
    """The entity types ``labels`` name, sorted (``O`` is none)."""
    return tuple(sorted({entity_type(label) for label in labels} - {OUTSIDE}))


def _labelled(probabilities: np.ndarray, labels: Sequence[str]) -> tuple[str, float]:
    best = int(probabilities.argmax())
    return labels[best], float(probabilities[best])


def _word_label(rows: np.ndarray, labels: Sequence[str], strategy: str) -> tuple[str, float]:
    """One word's label from its tokens' probability ``rows``, by ``strategy``."""
    if strategy == "first":
        return _labelled(rows[0], labels)
    if strategy == "max":
        return _labelled(rows[int(rows.max(axis=1).argmax())], labels)
    return _labelled(rows.mean(axis=0), labels)  # average


def _group(items: list[tuple[str, float, int, int]]) -> list[tuple[str, float, int, int]]:
    """Consecutive ``(label, score, start, end)`` items continuing one entity, merged into
    ``(type, mean score, start of the first, end of the last)``."""
    groups: list[tuple[str, float, int, int]] = []
    run: list[tuple[str, float, int, int]] = []

    def close() -> None:
        if run:
            score = float(np.mean([item[1] for item in run], dtype=np.float32))
            groups.append((entity_type(run[0][0]), score, run[0][2], run[-1][3]))

    for item in items:
        if run:
            bi, tag = _bio(item[0])
            if tag == _bio(run[-1][0])[1] and bi != "B":
                run.append(item)
                continue
        close()
        run = [item]
    close()
    return groups


def text_entities(
    probabilities: np.ndarray,
    offsets: np.ndarray,
    special: np.ndarray,
    word_ids: Sequence[int | None],
    labels: Sequence[str],
    strategy: str,
    text: str | None = None,
) -> list[dict[str, Any]]:
    """The entities of one text from its tokens' ``probabilities`` ``[sequence, labels]``
    (padding and special tokens, 1 in ``special``, are skipped); ``word`` only with
    ``text``."""
    tokens = [i for i in range(len(special)) if not special[i]]
    entities: list[dict[str, Any]] = []

    def add(entity: str, score: float, start: int, end: int, **more: Any) -> None:
        found: dict[str, Any] = {"entity": entity, "score": score, **more}
        found.update(start=start, end=end)
        if text is not None:
            found["word"] = text[start:end]
        entities.append(found)

    if strategy == "none":
        for i in tokens:
            label, score = _labelled(probabilities[i], labels)
            if label != OUTSIDE:
                add(label, score, int(offsets[i, 0]), int(offsets[i, 1]), index=i)
        return entities
    items: list[tuple[str, float, int, int]] = []
    if strategy == "simple":
        for i in tokens:
            label, score = _labelled(probabilities[i], labels)
            items.append((label, score, int(offsets[i, 0]), int(offsets[i, 1])))
    else:
        words: list[list[int]] = []
        for i in tokens:  # a token of the word before it joins that word
            if words and word_ids[i] is not None and word_ids[i] == word_ids[words[-1][-1]]:
                words[-1].append(i)
            else:
                words.append([i])
        for word in words:
            label, score = _word_label(probabilities[word], labels, strategy)
            items.append((label, score, int(offsets[word[0], 0]), int(offsets[word[-1], 1])))
    for kind, score, start, end in _group(items):
        if kind != OUTSIDE:
            add(kind, score, start, end)
    return entities


class TokenClassification(Task):
    name = "token-classification"
    output_name = "token_logits"
    auto_model = "AutoModelForTokenClassification"
    head = heads.LOGITS
    batch_column = "entities"
    per_token = True
    # A classifier's tolerances, over one row per unpadded token.
    parity_tolerances: ClassVar[Mapping[str, float]] = {"fp32": 1e-3, "fp16": 1e-2, "int8": 0.35}
    quality_budget: ClassVar[Mapping[str, float]] = {"label_agreement": 0.99}
    graph_outputs = ("logits",)
    needs_labels = True
    parameters: ClassVar[Mapping[str, type]] = {"aggregation_strategy": str}
    tei_route = "entities"
    value_key = "entities_per_text"  # counted with the simple strategy, whatever was asked
    value_metric = m.ENTITIES_PER_TEXT
    category_key = "entity_types"
    category_feature = "entity_type"
    category_metric = m.ENTITIES
    shadow_agreement = 0.85  # one entity found, lost or moved changes a whole text

    def check_parameters(self, parameters: Mapping[str, Any], model: str) -> None:
        super().check_parameters(parameters, model)
        strategy = parameters.get("aggregation_strategy", DEFAULT_STRATEGY)
        if strategy not in STRATEGIES:
            raise InvalidInput(
                f"parameter 'aggregation_strategy' is {strategy!r}; use one of "
                f"{', '.join(STRATEGIES)}",
                param="parameters",
            )

    def tokenize(
        self, tokenizer: TextTokenizer, texts: list[str], parameters: Mapping[str, Any]
    ) -> Batch:
        return tokenizer(texts, offsets=True)

    def postprocess(
        self,
        raw: np.ndarray,
        batch: Batch,
        texts: list[str],
        labels: Sequence[str],
        parameters: Mapping[str, Any],
    ) -> tuple[Any, np.ndarray]:
        probabilities = softmax(raw.astype(np.float32))
        strategy = parameters.get("aggregation_strategy", DEFAULT_STRATEGY)
        outputs = [
            text_entities(*self._token_data(probabilities, batch, i), labels, strategy, text)
            for i, text in enumerate(texts)
        ]
        return outputs, probabilities

    def figures(self, raw: np.ndarray, batch: Batch | None, labels: Sequence[str]) -> Figures:
        if batch is None or batch.special is None:
            raise ValueError("token-classification figures need the batch's offsets")
        types = entity_types(labels)
        column = {kind: j for j, kind in enumerate(types)}
        counts = np.zeros((len(raw), len(types)))
        for i in range(len(raw)):
            for entity in text_entities(*self._token_data(raw, batch, i), labels, "simple"):
                counts[i, column[entity["entity"]]] += 1
        return Figures(counts.sum(axis=1), counts, types)

    def counter_shares(
        self, figures: Figures, raw: np.ndarray, batch: Batch | None, labels: Sequence[str]
    ) -> tuple[np.ndarray, tuple[str, ...]]:
        """Shares of the labels predicted for the request's tokens, ``O`` included: unlike
        entities, every request has tokens, and a canary that finds nothing shows."""
        if batch is None or batch.special is None:
            return np.zeros(0), ()
        real = batch.special[:, : raw.shape[1]] == 0
        predicted = raw.argmax(axis=-1)[real]
        counts = np.bincount(predicted, minlength=len(labels))
        return counts / max(int(counts.sum()), 1), tuple(labels)

    def compare(self, champion: Prediction, canary: Prediction, texts: list[str]) -> Paired:
        """A text agrees when both find the same entities (type and span); the change is
        the largest share of a text's entities found by one version only."""
        kept, change = [], 0.0
        for ours, theirs in zip(champion.outputs, canary.outputs, strict=True):
            a, b = _spans(ours), _spans(theirs)
            kept.append(a == b)
            if a | b:
                change = max(change, len(a ^ b) / len(a | b))
        return agreeing(kept, change)

    def redacted(self, text: str, answer: Any) -> str:
        """Each entity of ``answer`` (found in ``text`` with the default strategy)
        replaced by its type in brackets: "[PER] lives in [LOC]"."""
        redacted = text
        for entity in sorted(answer, key=lambda e: e["start"], reverse=True):
            start, end = entity["start"], entity["end"]
            redacted = f"{redacted[:start]}[{entity['entity']}]{redacted[end:]}"
        return redacted

    @staticmethod
    def _token_data(
        probabilities: np.ndarray, batch: Batch, i: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Sequence[int | None]]:
        assert batch.offsets is not None and batch.special is not None
        assert batch.word_ids is not None
        return probabilities[i], batch.offsets[i], batch.special[i], batch.word_ids[i]


def _spans(entities: list[dict[str, Any]]) -> set[tuple[str, int, int]]:
    return {(e["entity"], e["start"], e["end"]) for e in entities}
