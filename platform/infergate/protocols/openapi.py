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
from infergate.observe.metrics import STAGES
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
    V2InferResponse,
    V2ModelMetadata,
    V2ServerMetadata,
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
        "200": {"description": "The model (or the version) answers"},
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
    ]
    if isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel
}
