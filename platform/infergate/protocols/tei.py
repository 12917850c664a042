"""Hugging Face's Text Embeddings Inference (TEI) API, one base URL per served model.

TEI serves one model per server; here ``/tei/{model}`` is that server's base URL, holding
TEI's routes: ``POST /`` (the route of the model's task, as TEI's own root), ``/embed``,
``/embed_sparse``, ``/embed_all``, ``/predict``, ``/rerank``, ``/similarity``,
``/tokenize``, ``/decode``, and ``GET /info``, ``/health`` and ``/metrics``
(``tei_routes`` holds the handlers). Clients written for TEI,
``huggingface_hub.InferenceClient(base_url=".../tei/embed")`` among them, work unchanged.
The reference is TEI's OpenAPI document
(https://huggingface.github.io/text-embeddings-inference/).

This module turns the request bodies (``tei_bodies``) into what the inference path
takes; ``tei_answers`` renders the answers. Pure: parse and render plug into
``Frontend.serve_inference``, so API keys, limits, canary routing and metrics are the
predict endpoint's.

Where TEI and infergate differ: texts are always truncated at the model's max length
(``/info`` says ``auto_truncate``), unless the body says ``"truncate": false``, which
refuses a text that is too long as TEI does; ``truncation_direction`` ``Left`` keeps a
long text's end (a copy of the version's tokenizer cuts it: the shared one is never
changed per request). Pairs on ``/predict`` are for text-ranking models (cross-encoders),
whose graphs number a pair's tokens; a classifier here reads one text. ``/embed_all`` is
refused (424): every served graph pools its token vectors inside. Token-id inputs are
refused (send text).
"""

from __future__ import annotations

from typing import Any

from infergate.protocols.tei_bodies import (
    EMBED_EXAMPLE,
    ClassificationParameters,
    EntitiesBody,
    EntitiesParameters,
    SimilarityParameters,
    TeiEmbedAllBody,
    TeiEmbedBody,
    TeiModelRerankBody,
    TeiPredictBody,
    TeiSimilarityBody,
    TeiSparseBody,
)
from infergate.protocols.truncation import direction_parameter
from infergate.protocols.wire import Limits, PredictRequest, json_object
from infergate.serving.prompts import PROMPT_NAME

# -- bodies to what the inference path takes ------------------------------------------------


def _request(texts: list[str], parameters: dict[str, Any], **extra: Any) -> PredictRequest:
    return PredictRequest(texts=texts, parameters=parameters, extra=extra)


def _options(prompt_name: str | None = None, direction: str | None = None) -> dict[str, Any]:
    """The parameters the inference path reads from TEI's options: the prompt, and the
    end of a long text that is cut (the default, right, left out)."""
    options: dict[str, Any] = {PROMPT_NAME: prompt_name} if prompt_name is not None else {}
    return {**options, **direction_parameter(direction)}


def parse_embed(body: bytes, limits: Limits) -> PredictRequest:
    request = TeiEmbedBody.parse(body, limits)
    texts = request.inputs if isinstance(request.inputs, list) else [request.inputs]
    return _request(
        texts, _options(request.prompt_name, request.truncation_direction), route="embed",
        normalize=request.normalize, dimensions=request.dimensions, truncate=request.truncate,
    )  # fmt: skip


def parse_similarity(body: bytes, limits: Limits) -> PredictRequest:
    request = TeiSimilarityBody.parse(body, limits)
    options = request.parameters or SimilarityParameters()
    texts = [request.inputs.source_sentence, *request.inputs.sentences]
    return _request(
        texts, _options(options.prompt_name, options.truncation_direction), route="similarity",
        truncate=options.truncate,
    )  # fmt: skip


def parse_embed_or_similarity(body: bytes, limits: Limits) -> PredictRequest:
    """``POST /`` of an embedding model: TEI's embed body, or the similarity body that
    huggingface_hub's sentence_similarity sends to the same URL."""
    payload = json_object(body, limits, EMBED_EXAMPLE)
    if isinstance(payload.get("inputs"), dict):
        return parse_similarity(body, limits)
    return parse_embed(body, limits)


def parse_sparse(body: bytes, limits: Limits) -> PredictRequest:
    request = TeiSparseBody.parse(body, limits)
    texts = request.inputs if isinstance(request.inputs, list) else [request.inputs]
    return _request(
        texts, _options(request.prompt_name, request.truncation_direction),
        route="embed_sparse", truncate=request.truncate,
    )  # fmt: skip


def _rows(inputs: str | list[str] | list[list[str]]) -> tuple[bool, list[list[str]]]:
    """Whether ``inputs`` (as ``TeiPredictBody`` checked them) is one text or pair, and
    its rows: one text, or a pair, each."""
    if isinstance(inputs, str):
        return True, [[inputs]]
    if all(isinstance(item, str) for item in inputs):
        return True, [[item for item in inputs if isinstance(item, str)]]
    return False, [item for item in inputs if isinstance(item, list)]


def parse_embed_all(body: bytes, limits: Limits) -> PredictRequest:
    request = TeiEmbedAllBody.parse(body, limits)
    texts = request.inputs if isinstance(request.inputs, list) else [request.inputs]
    return _request(
        texts, _options(request.prompt_name, request.truncation_direction), route="embed_all",
        truncate=request.truncate,
    )  # fmt: skip


def parse_predict(body: bytes, limits: Limits) -> PredictRequest:
    """One text, one pair, or a batch of either (all texts or all pairs). A pair's first
    text is the query its second is read with, as a cross-encoder reads them."""
    request = TeiPredictBody.parse(body, limits)
    options = request.parameters or ClassificationParameters()
    raw = request.raw_scores or options.function_to_apply == "none"
    single, rows = _rows(request.inputs)
    parameters = _options(direction=request.truncation_direction)
    if raw:
        parameters["raw_scores"] = True
    pairs = len(rows[0]) == 2
    if pairs:
        parameters["query"] = [row[0] for row in rows]
    return _request(
        [row[-1] for row in rows], parameters, route="predict", single=single, pairs=pairs,
        top_k=options.top_k, truncate=request.truncate,
    )  # fmt: skip


def parse_rerank(body: bytes, limits: Limits) -> PredictRequest:
    request = TeiModelRerankBody.parse(body, limits)
    parameters = {"query": request.query, **_options(direction=request.truncation_direction)}
    if request.raw_scores:
        parameters["raw_scores"] = True
    return _request(
        request.texts, parameters, route="rerank", top_n=request.top_n,
        return_text=request.return_text, truncate=request.truncate,
    )  # fmt: skip


def parse_entities(body: bytes, limits: Limits) -> PredictRequest:
    request = EntitiesBody.parse(body, limits)
    options = request.parameters or EntitiesParameters()
    single = isinstance(request.inputs, str)
    texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
    parameters = {}
    if options.aggregation_strategy is not None:
        parameters["aggregation_strategy"] = options.aggregation_strategy
    return _request(
        texts, parameters, route="entities", single=single,
        ignore=frozenset(options.ignore_labels or ()), truncate=None,
    )  # fmt: skip


# The parser of each TEI route, and of ``POST /`` by the model's task (Task.tei_route).
PARSERS = {
    "embed": parse_embed,
    "embed_sparse": parse_sparse,
    "predict": parse_predict,
    "rerank": parse_rerank,
    "similarity": parse_similarity,
}
ROOT_PARSERS = {**PARSERS, "embed": parse_embed_or_similarity, "entities": parse_entities}
