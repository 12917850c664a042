"""The answers of the HTTP API as the OpenAPI document describes them. The requests are
declared where they are parsed (``PredictBody``, ``EmbeddingsBody``, ``RerankBody``,
``V2InferRequest``); the renderers build plain dicts for speed, and tests validate what
each protocol renders against these."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


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
    loaded: bool = Field(
        description="Whether the version is loaded in Triton now; one that is not is loaded "
        "by its next request (triton.max_loaded_versions, triton.idle_unload_s)."
    )


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


# -- Text Embeddings Inference's answers (infergate.protocols.tei_answers) --------------------


class TeiErrorBody(BaseModel):
    error: str = Field(description="What was wrong and how to fix it.")
    error_type: Literal["validation", "tokenizer", "backend", "overloaded", "unhealthy"]


class TeiPrediction(BaseModel):
    label: str
    score: float


class TeiSparseValue(BaseModel):
    index: int = Field(description="A token id with a weight above 0.")
    value: float


class TeiToken(BaseModel):
    id: int
    text: str = Field(description="The text the token stands for; a special token's name.")
    special: bool
    start: int | None = Field(description="Character span in the text; null if special.")
    stop: int | None


class TeiInfo(BaseModel):
    model_id: str = Field(description="The served model's name.")
    model_sha: None = None
    model_dtype: str = Field(description="The precision it was registered at.")
    model_type: dict[str, dict[str, object]] = Field(
        description='{"embedding": {"pooling"}}, {"classifier": {"id2label", "label2id"}} '
        'or {"reranker": ...}'
    )
    max_input_length: int = Field(description="Tokens per text; longer texts are cut.")
    max_batch_tokens: int
    max_client_batch_size: int = Field(description="Texts per request.")
    auto_truncate: bool
    tokenization_workers: int
    version: str = Field(description="infergate's version.")
    model_version: str = Field(description="The model version that answered.")
    prompts: dict[str, str] = Field(description="The version's named prompts.")
    default_prompt_name: str | None
