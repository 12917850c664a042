"""OpenAI's embeddings API on the front-end, for the clients written against it.

``POST /v1/embeddings`` (also under ``/openai/v1``) takes OpenAI's request body and
answers in its shape; ``GET /openai/v1/models`` lists the served models as OpenAI does.
Users point ``openai.OpenAI(base_url="http://host:8000/openai/v1")`` at the front-end.
The reference: https://platform.openai.com/docs/api-reference/embeddings

Pure: parse, check and render plug into ``Frontend.serve_inference``, so routing,
canaries, metrics and headers are the predict endpoint's. Texts get the predict
endpoint's limits and validation (``infergate.protocols.wire``); statuses stay the platform's
(422 for valid JSON of the wrong shape, where OpenAI itself answers 400).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from infergate.errors import InfergateError, InvalidInput, ModelNotFound
from infergate.protocols.wire import (
    Answer,
    Body,
    Limits,
    PredictRequest,
    json_type,
    validate_texts,
)
from infergate.serving.postprocess import l2_normalize
from infergate.serving.prompts import PROMPT_NAME
from infergate.tasks import TASKS

if TYPE_CHECKING:
    from infergate.serving.routing import ServedModel
    from infergate.serving.runtime import ModelRuntime

ENCODINGS = ("float", "base64")
EXAMPLE = '{"model": "embed", "input": ["first text", "second text"]}'
OWNER = "infergate"


class EmbeddingsBody(Body):
    """OpenAI's embeddings request; token-id inputs are refused."""

    example: ClassVar[str] = EXAMPLE
    model: str = Field(description="A served embedding model.", examples=["embed"])
    input: str | list[str] = Field(
        description="One text, or a list of texts (one embedding per text).",
        examples=["A sentence to embed", ["first text", "second text"]],
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: the little-endian float32 bytes of each vector."
    )
    dimensions: int | None = Field(
        None, ge=1, description="Keep the first dimensions, then scale to unit length."
    )
    user: str | None = Field(None, description="Accepted and ignored.")
    prompt_name: str | None = Field(
        None,
        description="infergate's: a prompt the model was registered with, put before each "
        "text (default: its default prompt, if it has one). openai's client sends it in "
        "extra_body.",
    )

    @classmethod
    def check(cls, payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
        model = payload.get("model")
        if model is None:
            raise InvalidInput(
                f"field 'model' is missing; name a served model, e.g. {EXAMPLE} "
                "(GET /openai/v1/models lists them)",
                param="model",
            )
        if not isinstance(model, str) or not model:
            raise InvalidInput(
                f"'model' must be the name of a served model, got {_shown(model)}", param="model"
            )
        if "input" not in payload:
            raise InvalidInput(f"field 'input' is missing; expected {EXAMPLE}", param="input")
        _refuse_token_ids(payload["input"])
        texts = validate_texts(payload["input"], limits, "input")
        encoding = payload.get("encoding_format")
        if encoding is not None and encoding not in ENCODINGS:
            raise InvalidInput(
                f"'encoding_format' must be 'float' or 'base64', got {_shown(encoding)}",
                param="encoding_format",
            )
        dimensions = payload.get("dimensions")
        if dimensions is not None and (
            not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1
        ):
            raise InvalidInput(
                f"'dimensions' must be a whole number of at least 1, got {_shown(dimensions)}",
                param="dimensions",
            )
        user = payload.get("user")
        if user is not None and not isinstance(user, str):  # accepted, not used
            raise InvalidInput(f"'user' must be a string, got {json_type(user)}", param="user")
        prompt_name = payload.get(PROMPT_NAME)
        if prompt_name is not None and not isinstance(prompt_name, str):
            raise InvalidInput(
                f"'{PROMPT_NAME}' must be a string, got {json_type(prompt_name)}",
                param=PROMPT_NAME,
            )
        return {
            "model": model,
            "input": texts,
            PROMPT_NAME: prompt_name,
            "encoding_format": encoding or "float",
            "dimensions": dimensions,
            "user": user,
        }


def parse_embeddings(body: bytes, limits: Limits) -> PredictRequest:
    """An embeddings request: the model it names, its texts, and in ``extra`` the
    ``encoding_format`` and ``dimensions`` (None: all of the model's)."""
    request = EmbeddingsBody.parse(body, limits)
    texts = request.input if isinstance(request.input, list) else [request.input]
    extra = {"encoding_format": request.encoding_format, "dimensions": request.dimensions}
    parameters = {PROMPT_NAME: request.prompt_name} if request.prompt_name is not None else {}
    return PredictRequest(texts=texts, parameters=parameters, model=request.model, extra=extra)


def _refuse_token_ids(inputs: Any) -> None:
    """OpenAI also takes token ids (a list of ints, or of lists of ints); ids of OpenAI's
    tokenizer mean nothing to a served model, which has its own."""
    if not isinstance(inputs, list) or not inputs:
        return
    if all(_is_token_ids(item) for item in inputs) or _is_token_ids(inputs):
        raise InvalidInput(
            "'input' holds token ids; this server takes text only (each model tokenizes "
            "with its own tokenizer): send a string or a list of strings",
            param="input",
        )


def _is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(item, int) and not isinstance(item, bool) for item in value)
    )


def _shown(value: Any) -> str:
    """A received value in a message: short strings and numbers as they are, else the type."""
    if isinstance(value, str) and len(value) <= 40:
        return repr(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return json_type(value)


def refuse_unless_embeddings(request: PredictRequest, runtime: ModelRuntime) -> None:
    """Before the picked version runs: it must make embeddings, with at least the
    dimensions asked for."""
    served, spec = runtime.served, runtime.spec
    if not TASKS[spec.task].openai_embeddings:
        embedding = " or ".join(t.name for t in TASKS.values() if t.openai_embeddings)
        raise InvalidInput(
            f"model {served.name!r} is a {spec.task} model and makes no embeddings; name an "
            f"embedding ({embedding}) model (GET /v1/models shows each model's task)",
            param="model",
        )
    dimensions = request.extra.get("dimensions")
    if dimensions is not None and dimensions > spec.output_dim:
        raise InvalidInput(
            f"'dimensions' is {dimensions}, but model {served.name!r} makes vectors of "
            f"{spec.output_dim}; ask for 1 to {spec.output_dim}",
            param="dimensions",
        )


def render_embeddings(answer: Answer) -> dict[str, Any]:
    """OpenAI's ``list`` of ``embedding`` objects, in the order of the input, with the
    tokens the model saw (special tokens included, after truncation) as usage."""
    vectors = _vectors(answer)
    as_base64 = answer.request.extra.get("encoding_format") == "base64"
    data = [
        {"object": "embedding", "index": index, "embedding": _base64(row) if as_base64 else row}
        for index, row in enumerate(vectors)
    ]
    tokens = int(answer.prediction.batch.lengths.sum())
    return {
        "object": "list",
        "data": data,
        "model": answer.model.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _vectors(answer: Answer) -> np.ndarray:
    """Unit vectors as float32; cut to ``dimensions`` first when asked, which suits
    models trained to keep the leading dimensions meaningful (Matryoshka)."""
    dimensions = answer.request.extra.get("dimensions")
    if dimensions is None:
        vectors = np.asarray(answer.prediction.outputs)
    else:
        vectors = l2_normalize(np.asarray(answer.prediction.raw)[:, :dimensions])
    return np.ascontiguousarray(vectors, dtype=np.float32)


def _base64(vector: np.ndarray) -> str:
    """Little-endian float32 bytes in base64, as OpenAI's clients decode them."""
    return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")


def model_entry(model: ServedModel) -> dict[str, Any]:
    """One model in OpenAI's shape. ``created`` is 0: the front-end does not know when a
    model was registered."""
    return {"id": model.name, "object": "model", "created": 0, "owned_by": OWNER}


def model_list(models: Iterable[ServedModel]) -> dict[str, Any]:
    entries = [model_entry(model) for model in sorted(models, key=lambda m: m.name)]
    return {"object": "list", "data": entries}


def error_body(error: InfergateError) -> dict[str, Any]:
    """OpenAI's error shape, which its clients read: ``code`` is the platform's kind
    (``model_not_found``, ``invalid_input``), ``param`` the field at fault or null."""
    param = error.param
    if param is None and isinstance(error, ModelNotFound):
        param = "model"
    return {
        "error": {
            "message": error.message,
            "type": _error_type(error.status),
            "param": param,
            "code": error.kind,
        }
    }


def _error_type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"
