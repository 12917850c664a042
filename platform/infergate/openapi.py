"""The OpenAPI document of the HTTP API, generated from typed models of its bodies."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel, Field

from infergate import __version__
from infergate.metrics import STAGES


class PredictBody(BaseModel):
    inputs: str | list[str] = Field(
        description="One text, or a list of texts (one output per text).",
        examples=["I love this film", ["first text", "second text"]],
    )
    parameters: dict[str, bool] = Field(
        default_factory=dict,
        description="Optional. feature-extraction: 'normalize' (default true) L2-normalises.",
    )


class Classification(BaseModel):
    label: str
    score: float
    scores: dict[str, float]


class PredictResponse(BaseModel):
    model: str
    version: str
    outputs: list[Classification] | list[list[float]] = Field(
        description="Per input: label and scores (text-classification) or a vector "
        "(feature-extraction)."
    )


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


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


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


@cache
def openapi_document() -> dict[str, Any]:
    models: list[type[BaseModel]] = [
        PredictBody, Classification, PredictResponse, VersionInfo, ModelInfo, ModelList,
        ErrorBody,
    ]  # fmt: skip
    schemas: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "infergate", "version": __version__},
        "paths": {
            "/v1/models/{name}/predict": {
                "post": {**_predict_operation("Predict with a model"), "parameters": [name]}
            },
            "/predict": {"post": _predict_operation("Predict with the default model")},
            "/v1/models": {"get": {"responses": {"200": _json(ModelList, "Served models")}}},
            "/v1/models/{name}": {
                "get": {
                    "parameters": [name],
                    "responses": {
                        "200": _json(ModelInfo, "Versions, roles and weights"),
                        "404": _json(ErrorBody, "Unknown model"),
                    },
                }
            },
            "/healthz": {"get": {"responses": {"200": {"description": "Process alive"}}}},
            "/readyz": {
                "get": {
                    "responses": {
                        "200": {"description": "Every served version answers"},
                        "503": _json(ErrorBody, "Some version is not ready"),
                    }
                }
            },
        },
        "components": {"schemas": schemas},
    }
