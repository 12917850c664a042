"""The OpenAPI document of the HTTP API, generated from what is declared once elsewhere:
the route table (``infergate.protocols.frontend.ROUTES``, each route with its operation
from here), the request bodies each protocol parses with (``PredictBody``,
``EmbeddingsBody``, ``RerankBody``, ``V2InferRequest``...) and the answers' models
(``infergate.protocols.schemas``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from infergate import __version__
from infergate.observe.metrics import COLD_START_HEADER, STAGES
from infergate.protocols import schemas
from infergate.protocols.openai_api import EmbeddingsBody
from infergate.protocols.rerank import RerankBody, TeiRerankBody
from infergate.protocols.routes import Route
from infergate.protocols.schemas import (
    EmbeddingsResponse,
    ErrorBody,
    ModelInfo,
    ModelList,
    OpenAIErrorBody,
    OpenAIModel,
    OpenAIModelList,
    PredictResponse,
    RerankResponse,
    RerankResult,
    TeiErrorBody,
    TeiInfo,
    TeiPrediction,
    TeiSparseValue,
    TeiToken,
    V2InferResponse,
    V2ModelMetadata,
    V2ServerMetadata,
)
from infergate.protocols.tei_bodies import (
    DecodeBody,
    TeiEmbedAllBody,
    TeiEmbedBody,
    TeiModelRerankBody,
    TeiPredictBody,
    TeiSimilarityBody,
    TeiSparseBody,
    TokenizeBody,
)
from infergate.protocols.v2_request import V2InferRequest
from infergate.protocols.wire import PredictBody

BINARY_BODY = {
    "description": "The JSON object, then the binary tensors; the header "
    "Inference-Header-Content-Length gives the JSON's length in bytes. BYTES elements: a "
    "4-byte little-endian length, then the UTF-8 text.",
    "schema": {"type": "string", "format": "binary"},
}


_REF = "#/components/schemas/"


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF + model.__name__}


def _json(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


TIMING_HEADERS = {
    name: {"description": text, "schema": {"type": "string"}}
    for name, text in {
        "x-model-version": "The model version that answered.",
        **{stage.header: f"Milliseconds spent {stage.spent}." for stage in STAGES},
        COLD_START_HEADER: "Seconds this request waited for its version to be loaded into "
        "Triton (load on demand); only on such an answer.",
    }.items()
}
ERRORS = {
    "400": "Empty body, broken JSON or invalid UTF-8.",
    "404": "Unknown model.",
    "413": "Body, text or list too large.",
    "415": "Not JSON.",
    "422": "Valid JSON of the wrong shape.",
    "503": "Backend unavailable, or this replica still starting.",
    "504": "The model did not answer within the front-end's deadline.",
}


def _predict_operation(summary: str) -> dict[str, Any]:
    responses = {"200": {**_json(PredictResponse, "Outputs"), "headers": TIMING_HEADERS}}
    responses.update({code: _json(ErrorBody, text) for code, text in ERRORS.items()})
    return {
        "summary": summary,
        "requestBody": {"required": True, **_json(PredictBody, "Texts")},
        "responses": responses,
    }


def _rerank_operation(summary: str, tei: bool) -> dict[str, Any]:
    ok: dict[str, Any] = _json(RerankResponse, "Results, best first")
    if tei:
        schema = {"type": "array", "items": _ref(RerankResult)}
        ok = {
            "description": "Results, best first",
            "content": {"application/json": {"schema": schema}},
        }
    responses = {"200": {**ok, "headers": TIMING_HEADERS}}
    responses.update({code: _json(ErrorBody, text) for code, text in ERRORS.items()})
    return {
        "summary": summary,
        "requestBody": {
            "required": True,
            **_json(TeiRerankBody if tei else RerankBody, "Query and texts"),
        },
        "responses": responses,
    }


def _embeddings_operation() -> dict[str, Any]:
    responses = {"200": {**_json(EmbeddingsResponse, "Embeddings"), "headers": TIMING_HEADERS}}
    responses.update({code: _json(OpenAIErrorBody, text) for code, text in ERRORS.items()})
    return {
        "summary": "Embeddings in OpenAI's API",
        "requestBody": {"required": True, **_json(EmbeddingsBody, "Model and texts")},
        "responses": responses,
    }


# -- what each route's entry in the document says: the routes themselves are declared once,
# in infergate.protocols.frontend.ROUTES, each with its operation from here --------------

PREDICT_NAMED = _predict_operation("Predict with a model")
PREDICT_DEFAULT = _predict_operation("Predict with the default model")
RERANK_NAMED = _rerank_operation("Rank texts against a query (text-ranking)", False)
RERANK_TEI = _rerank_operation("Rerank in TEI's shape (the only text-ranking model)", True)
MODEL_LIST = {"responses": {"200": _json(ModelList, "Served models")}}
MODEL_INFO = {
    "responses": {
        "200": _json(ModelInfo, "Versions, roles and weights"),
        "404": _json(ErrorBody, "Unknown model"),
    }
}
HEALTHZ = {"responses": {"200": {"description": "Process alive"}}}
READYZ = {
    "responses": {
        "200": {"description": "Every served version answers"},
        "503": _json(ErrorBody, "Some version is not ready"),
    }
}
EMBEDDINGS = _embeddings_operation()
OPENAI_MODELS = {"responses": {"200": _json(OpenAIModelList, "Served models")}}
OPENAI_MODEL = {
    "responses": {
        "200": _json(OpenAIModel, "One served model"),
        "404": _json(OpenAIErrorBody, "Unknown model"),
    }
}

# -- Text Embeddings Inference's API (infergate.protocols.tei) -----------------------------

_TEI_ERRORS = {
    **ERRORS,
    "424": "A route the model's task does not serve (/embed of a classifier).",
    "429": "Rate limited or overloaded.",
}


def _array(items: dict[str, Any], depth: int = 1) -> dict[str, Any]:
    for _ in range(depth):
        items = {"type": "array", "items": items}
    return items


def _tei_operation(
    summary: str, body: type[BaseModel] | None, answer: dict[str, Any], errors: bool = True
) -> dict[str, Any]:
    ok = {"description": "TEI's answer", "content": {"application/json": {"schema": answer}}}
    operation: dict[str, Any] = {"summary": summary, "tags": ["Text Embeddings Inference"]}
    if body is not None:
        operation["requestBody"] = {"required": True, **_json(body, "TEI's request")}
    responses = {"200": {**ok, "headers": TIMING_HEADERS} if errors else ok}
    responses.update({code: _json(TeiErrorBody, text) for code, text in _TEI_ERRORS.items()})
    return {**operation, "responses": responses}


_VECTORS = _array({"type": "number"}, 2)
_LABELS = {"oneOf": [_array(_ref(TeiPrediction)), _array(_ref(TeiPrediction), 2)]}
TEI_ROOT = _tei_operation(
    "The route of the model's task (embed, embed_sparse, predict or rerank; a "
    "token-classification model answers Hugging Face's inference API shape)",
    None,
    {"oneOf": [_VECTORS, _LABELS, _array(_ref(TeiSparseValue), 2), _array(_ref(RerankResult))]},
)
TEI_EMBED = _tei_operation("Embeddings (feature-extraction)", TeiEmbedBody, _VECTORS)
TEI_EMBED_SPARSE = _tei_operation(
    "Sparse embeddings (sparse-embedding)", TeiSparseBody, _array(_ref(TeiSparseValue), 2)
)
TEI_PREDICT = _tei_operation(
    "Labels, best first (text-classification; pairs: text-ranking)", TeiPredictBody, _LABELS
)
TEI_RERANK = _tei_operation(
    "Texts ranked against a query (text-ranking)", TeiModelRerankBody, _array(_ref(RerankResult))
)
TEI_SIMILARITY = _tei_operation(
    "Cosine of each sentence with the source (feature-extraction)",
    TeiSimilarityBody,
    _array({"type": "number"}),
)
TEI_TOKENIZE = _tei_operation("Tokens", TokenizeBody, _array(_ref(TeiToken), 2), errors=False)
TEI_DECODE = _tei_operation("Token ids to text", DecodeBody, _array({"type": "string"}), False)
TEI_INFO = _tei_operation("The model", None, _ref(TeiInfo), errors=False)
TEI_EMBED_ALL = _tei_operation(
    "Per-token embeddings: refused (424), as no served graph gives them out",
    TeiEmbedAllBody,
    _array({"type": "number"}, 3),
)
TEI_HEALTH = {
    "summary": "200 when every served version of the model answers, else 503",
    "tags": ["Text Embeddings Inference"],
    "responses": {
        "200": {"description": "The model answers"},
        "503": _json(TeiErrorBody, "A version of the model does not answer"),
    },
}
TEI_METRICS = {
    "summary": "The model's infergate_ series, from the platform's Prometheus",
    "tags": ["Text Embeddings Inference"],
    "responses": {
        "200": {
            "description": "Prometheus's text format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        "404": _json(TeiErrorBody, "Unknown model, or no Prometheus configured"),
        "503": _json(TeiErrorBody, "Prometheus did not answer"),
    },
}

_V2_NOT_FOUND = {"404": _json(ErrorBody, "Unknown model or version")}
_V2_INFER_ERRORS = {
    **{code: _json(ErrorBody, text) for code, text in ERRORS.items()},
    "400": _json(ErrorBody, ERRORS["400"] + " Binary data that does not add up."),
    "415": _json(ErrorBody, "Neither JSON nor application/octet-stream."),
}
V2_INFER = {
    "summary": "Infer (Open Inference Protocol)",
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _ref(V2InferRequest)},
            "application/octet-stream": BINARY_BODY,
        },
    },
    "responses": {
        "200": {
            "description": "Outputs; with binary outputs, the JSON then their bytes",
            "headers": TIMING_HEADERS,
            "content": {
                "application/json": {"schema": _ref(V2InferResponse)},
                "application/octet-stream": BINARY_BODY,
            },
        },
        **_V2_INFER_ERRORS,
    },
}
V2_MODEL_METADATA = {
    "responses": {"200": _json(V2ModelMetadata, "Inputs and outputs"), **_V2_NOT_FOUND}
}
V2_MODEL_READY = {
    "responses": {
        "200": {
            "description": "The model (or the version) answers, or is out of Triton and "
            "loads on its next request (docs/many-models.md)"
        },
        **_V2_NOT_FOUND,
        "503": _json(ErrorBody, "Some version does not answer"),
    }
}
V2_LIVE = {"responses": {"200": {"description": "Process alive"}}}
V2_READY = {
    "responses": {
        "200": {"description": "As /readyz: every served version answers"},
        "503": _json(ErrorBody, "Some version is not ready"),
    }
}
V2_SERVER_METADATA = {"responses": {"200": _json(V2ServerMetadata, "Server metadata")}}


def openapi_document(routes: Iterable[Route]) -> dict[str, Any]:
    """The document of ``routes``: each route's operation, its path parameters, and the
    schema of every body model the operations refer to (with the models those nest)."""
    paths: dict[str, Any] = {}
    for route in routes:
        if route.doc is None:
            continue
        operation = dict(route.doc)
        if route.parameters:
            operation["parameters"] = [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                for name in route.parameters
            ]
        paths.setdefault(route.pattern, {})[route.method.lower()] = operation
    schemas: dict[str, Any] = {}
    for model in _referenced(paths):
        schema = model.model_json_schema(ref_template=_REF + "{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return {
        "openapi": "3.1.0",
        "info": {"title": "infergate", "version": __version__},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _referenced(document: Any) -> list[type[BaseModel]]:
    """The body models ``document`` refers to by ``$ref``, in order of first mention."""
    found: dict[str, None] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(_REF):
                found.setdefault(ref.removeprefix(_REF))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    return [_MODELS[name] for name in found]


_MODELS: dict[str, type[BaseModel]] = {
    value.__name__: value
    for value in [
        *vars(schemas).values(),
        PredictBody,
        EmbeddingsBody,
        RerankBody,
        TeiRerankBody,
        V2InferRequest,
        TeiEmbedBody,
        TeiSparseBody,
        TeiEmbedAllBody,
        TeiPredictBody,
        TeiModelRerankBody,
        TeiSimilarityBody,
        TokenizeBody,
        DecodeBody,
    ]
    if isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel
}
