"""Hugging Face's Text Embeddings Inference (TEI) API, one base URL per served model.

TEI serves one model per server; here ``/tei/{model}`` is that server's base URL, holding
TEI's routes: ``POST /`` (the route of the model's task, as TEI's own root), ``/embed``,
``/embed_sparse``, ``/predict``, ``/rerank``, ``/similarity``, ``/tokenize``, ``/decode``
and ``GET /info``. Clients written for TEI, ``huggingface_hub.InferenceClient(base_url=
".../tei/embed")`` among them, work unchanged. The reference is TEI's OpenAPI document
(https://huggingface.github.io/text-embeddings-inference/).

This module turns the request bodies (``tei_bodies``) into what the inference path
takes; ``tei_answers`` renders the answers. Pure: parse and render plug into
``Frontend.serve_inference``, so API keys, limits, canary routing and metrics are the
predict endpoint's.

Where TEI and infergate differ: texts are always truncated at the model's max length
(``/info`` says ``auto_truncate``), unless the body says ``"truncate": false``, which
refuses a text that is too long as TEI does; ``truncation_direction`` takes ``right``
only; token-id inputs are refused (send text).
"""

from __future__ import annotations

from typing import Any

from infergate.protocols.tei_bodies import (
    EMBED_EXAMPLE,
    ClassificationParameters,
    EntitiesBody,
    EntitiesParameters,
    SimilarityParameters,
    TeiEmbedBody,
    TeiModelRerankBody,
    TeiPredictBody,
    TeiSimilarityBody,
    TeiSparseBody,
)
from infergate.protocols.wire import Limits, PredictRequest, json_object
from infergate.serving.prompts import PROMPT_NAME

# -- bodies to what the inference path takes ------------------------------------------------


def _request(texts: list[str], parameters: dict[str, Any], **extra: Any) -> PredictRequest:
    return PredictRequest(texts=texts, parameters=parameters, extra=extra)


def _prompt(name: str | None) -> dict[str, Any]:
    return {PROMPT_NAME: name} if name is not None else {}


def parse_embed(body: bytes, limits: Limits) -> PredictRequest:
    request = TeiEmbedBody.parse(body, limits)
    texts = request.inputs if isinstance(request.inputs, list) else [request.inputs]
    return _request(
        texts, _prompt(request.prompt_name), route="embed", normalize=request.normalize,
        dimensions=request.dimensions, truncate=request.truncate,
    )  # fmt: skip


def parse_similarity(body: bytes, limits: Limits) -> PredictRequest:
    request = TeiSimilarityBody.parse(body, limits)
    options = request.parameters or SimilarityParameters()
    texts = [request.inputs.source_sentence, *request.inputs.sentences]
    return _request(
        texts, _prompt(options.prompt_name), route="similarity", truncate=options.truncate
    )


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
        texts, _prompt(request.prompt_name), route="embed_sparse", truncate=request.truncate
    )


def parse_predict(body: bytes, limits: Limits) -> PredictRequest:
    request = TeiPredictBody.parse(body, limits)
    options = request.parameters or ClassificationParameters()
    raw = request.raw_scores or options.function_to_apply == "none"
    single = isinstance(request.inputs, str)
    texts = [request.inputs] if isinstance(request.inputs, str) else [t[0] for t in request.inputs]
    return _request(
        texts, {"raw_scores": True} if raw else {}, route="predict", single=single,
        top_k=options.top_k, truncate=request.truncate,
    )  # fmt: skip


def parse_rerank(body: bytes, limits: Limits) -> PredictRequest:
    request = TeiModelRerankBody.parse(body, limits)
    parameters: dict[str, Any] = {"query": request.query}
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
