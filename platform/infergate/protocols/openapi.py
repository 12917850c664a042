"""The OpenAPI document of the HTTP API, generated from what is declared once elsewhere:
the route table (``infergate.protocols.frontend.ROUTES``, each route with its operation
from here) and the request bodies each protocol parses with (``PredictBody``,
``EmbeddingsBody``, ``RerankBody``...). The answers' models are here; a test renders each
protocol's answers and validates them against these."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, Field

from infergate import __version__
from infergate.observe.metrics import STAGES
from infergate.protocols.openai_api import EmbeddingsBody
from infergate.protocols.rerank import RerankBody, TeiRerankBody
from infergate.protocols.routes import Route
from infergate.protocols.wire import PredictBody


class Classification(BaseModel):
    label: str
    score: float
    scores: dict[str, float]


class Relevance(BaseModel):
    score: float = Field(description="Relevance to the query, 0 to 1 (or log-odds).")


class SparseVector(BaseModel):
    indices: list[int] = Field(description="Token ids with a weight above 0, heaviest first.")
    values: list[float]


class Entity(BaseModel):
    entity: str = Field(description="The entity type (the token's label with 'none').")
    score: float
    start: int = Field(description="Character offset of its start in the text.")
    end: int = Field(description="Character offset just past its end.")
    word: str = Field(description="text[start:end].")
    index: int | None = Field(None, description="The token's position ('none' only).")


class Translated(BaseModel):
    translation_text: str = Field(description="The text the model generated.")


class PredictResponse(BaseModel):
    model: str
    version: str
    outputs: (
        list[Classification]
        | list[list[float]]
        | list[Relevance]
        | list[SparseVector]
        | list[list[Entity]]
        | list[Translated]
    ) = Field(
        description="Per input: label and scores (text-classification), a vector "
        "(feature-extraction), a relevance score (text-ranking), a sparse vector "
        "(sparse-embedding), its entities (token-classification), its translation "
        "(translation)."
    )


class RerankResult(BaseModel):
    index: int = Field(description="Position of the text in the request's texts.")
    score: float
    text: str | None = Field(None, description="With return_text.")


class RerankResponse(BaseModel):
    model: str
    version: str
    results: list[RerankResult] = Field(description="Best first.")


class VersionInfo(BaseModel):
    version: str
    role: str = Field(description="champion or canary")
    weight: int = Field(description="Share of traffic in percent.")


class ModelInfo(BaseModel):
    name: str
    task: str
    versions: list[VersionInfo]


class ModelList(BaseModel):
    models: list[ModelInfo]


class ErrorBody(BaseModel):
    error: str = Field(description="What was wrong and how to fix it.")
    type: str = Field(description="A stable machine-readable kind, e.g. invalid_input.")


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="A unit vector, or its base64 bytes.")


class Usage(BaseModel):
    prompt_tokens: int = Field(description="Tokens the model saw, special tokens included.")
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage


class OpenAIModel(BaseModel):
    id: str
    object: Literal["model"]
    created: int = Field(description="Always 0: the front-end does not know.")
    owned_by: str


class OpenAIModelList(BaseModel):
    object: Literal["list"]
    data: list[OpenAIModel]


class OpenAIError(BaseModel):
    message: str = Field(description="What was wrong and how to fix it.")
    type: str = Field(description="invalid_request_error, rate_limit_error or server_error.")
    param: str | None = Field(description="The request field at fault, if one is.")
    code: str = Field(description="The kind, as in ErrorBody's type.")


class OpenAIErrorBody(BaseModel):
    error: OpenAIError


# -- the Open Inference Protocol (KServe V2), infergate.protocols.kserve_v2 ------------------------


class V2InputTensor(BaseModel):
    name: str = Field(description="Always 'text'.", examples=["text"])
    shape: list[int] = Field(description="[n] (or [n, 1]) for n texts.", examples=[[2]])
    datatype: str = Field(description="Always 'BYTES'.", examples=["BYTES"])
    data: list[str] | None = Field(
        None, description="The texts, row-major; absent when they follow as binary data."
    )
    parameters: dict[str, int] = Field(
        default_factory=dict,
        description="'binary_data_size': bytes of this tensor in the binary part of the body.",
    )


class V2RequestedOutput(BaseModel):
    name: str = Field(description="probabilities or label (text-classification), embedding.")
    parameters: dict[str, bool] = Field(
        default_factory=dict, description="'binary_data': return it as binary data."
    )


class V2InferRequest(BaseModel):
    id: str | None = Field(None, description="Returned in the response.")
    inputs: list[V2InputTensor] = Field(description="One input, 'text'.")
    outputs: list[V2RequestedOutput] | None = Field(
        None, description="The outputs to return; all of the model's by default."
    )
    parameters: dict[str, bool] = Field(
        default_factory=dict,
        description="'binary_data_output': every output as binary data; 'normalize' (default "
        "true, feature-extraction only).",
    )


class V2OutputTensor(BaseModel):
    name: str
    shape: list[int]
    datatype: str = Field(description="FP32 or BYTES.")
    data: list[float] | list[str] | None = Field(
        None, description="Row-major; absent for an output returned as binary data."
    )
    parameters: dict[str, int] | None = Field(
        None, description="'binary_data_size' of an output returned as binary data."
    )


class V2InferResponse(BaseModel):
    model_name: str
    model_version: str = Field(description="The version that answered.")
    id: str | None = None
    outputs: list[V2OutputTensor]


class V2TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int] = Field(description="-1 where the size varies.")
    parameters: dict[str, list[str]] | None = Field(
        None, description="'labels': the columns of 'probabilities'."
    )


class V2ModelMetadata(BaseModel):
    name: str
    versions: list[str] = Field(description="The served versions (a path may name one).")
    platform: str
    inputs: list[V2TensorMetadata]
    outputs: list[V2TensorMetadata]


class V2ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


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


_MODELS = {
    value.__name__: value
    for value in list(globals().values())
    if isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel
}
