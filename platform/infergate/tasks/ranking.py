"""text-ranking: a cross-encoder scores (query, text) pairs, as TEI's and Cohere's rerank.

The model is a sequence classifier with one output (the relevance logit; score =
sigmoid) or two (not relevant, relevant; score = softmax of the second), as
sentence-transformers' CrossEncoder reads them. Each text is tokenized as the pair
(query, text), so the pairs of one request batch through Triton like any rows.
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

SAME_SCORE = 0.1  # a lone text's relevance kept: within this of the champion's


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow warning for large |x|


def relevance(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(scores in [0, 1], raw scores)`` of ``[n, 1]`` or ``[n, 2]`` logits; the raw score
    is the log-odds of relevance (the logit, or the difference of the two)."""
    if logits.shape[-1] == 1:
        raw = logits[:, 0]
        return sigmoid(raw), raw
    return softmax(logits)[:, 1], logits[:, 1] - logits[:, 0]


class TextRanking(Task):
    name = "text-ranking"
    output_name = "scores"
    auto_model = "AutoModelForSequenceClassification"
    head = heads.LOGITS
    pairs = True
    row_parameter = "query"  # infergate batch --query-column
    # A classifier's tolerances, gated on the relevance score a client is sent.
    parity_tolerances: ClassVar[Mapping[str, float]] = {"fp32": 1e-3, "fp16": 1e-2, "int8": 0.35}
    quality_budget: ClassVar[Mapping[str, float]] = {"rank_agreement": 0.97}
    graph_outputs = ("logits",)
    parameters: ClassVar[Mapping[str, type]] = {"query": str, "raw_scores": bool}
    probe_parameters: ClassVar[Mapping[str, Any]] = {"query": "readiness probe"}
    value_key = "relevance_score"
    value_metric = m.RELEVANCE_SCORE
    reranks = True
    tei_route = "rerank"

    def check_parameters(self, parameters: Mapping[str, Any], model: str) -> None:
        super().check_parameters(parameters, model)
        query = parameters.get("query")
        # A list holds one query per text: ``infergate batch --query-column`` (the HTTP
        # protocols take one string, checked against ``parameters`` by the wire).
        queries = query if isinstance(query, list) else [query]
        if not queries or not all(isinstance(q, str) and q.strip() for q in queries):
            raise InvalidInput(
                f"{model!r} is a text-ranking model: it scores texts against a query; send "
                '"parameters": {"query": "..."} (or use /v1/models/{name}/rerank)',
                param="parameters",
            )

    def output_dim_problem(self, dim: int) -> str | None:
        if dim in (1, 2):
            return None
        return (
            "a text-ranking model (cross-encoder) has 1 output (a relevance logit) or 2 "
            "(not relevant, relevant)"
        )

    def tokenize(
        self, tokenizer: TextTokenizer, texts: list[str], parameters: Mapping[str, Any]
    ) -> Batch:
        return tokenizer(texts, query=parameters["query"])

    def postprocess(
        self,
        raw: np.ndarray,
        batch: Batch,
        texts: list[str],
        labels: Sequence[str],
        parameters: Mapping[str, Any],
    ) -> tuple[Any, np.ndarray]:
        scores, raw_scores = relevance(raw)
        served = raw_scores if parameters.get("raw_scores", False) else scores
        return [{"score": score} for score in served.tolist()], scores[:, None]

    def figures(self, raw: np.ndarray, batch: Batch | None, labels: Sequence[str]) -> Figures:
        return Figures(raw[:, 0].astype(np.float64))

    def compare(self, champion: Prediction, canary: Prediction, texts: list[str]) -> Paired:
        """Each text's share of the request's other texts it is still ranked above or below
        as the champion ranks it (a lone text: its relevance within ``SAME_SCORE``); the
        change is the largest change of a relevance score."""
        ours, theirs = champion.raw[:, 0], canary.raw[:, 0]
        change = float(np.abs(ours - theirs).max(initial=0.0))
        if len(ours) == 1:
            return agreeing([change <= SAME_SCORE], change)
        same = np.sign(ours[:, None] - ours[None, :]) == np.sign(theirs[:, None] - theirs[None, :])
        np.fill_diagonal(same, False)
        return Paired(same.sum(axis=1) / (len(ours) - 1), change)


def ranked(scores: Sequence[float], texts: Sequence[str], top_n: int | None,
           return_text: bool) -> list[dict[str, Any]]:  # fmt: skip
    """``[{"index", "score", "text"?}]`` best first (ties keep the input order), the first
    ``top_n`` of them."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]
    results = []
    for index in order:
        result: dict[str, Any] = {"index": index, "score": scores[index]}
        if return_text:
            result["text"] = texts[index]
        results.append(result)
    return results
