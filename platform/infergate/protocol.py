"""The wire format of the inference endpoint: parsing and validating request bodies.

Pure: no Ray, no Triton. Every way a body can be wrong maps to one typed error
whose message says what was received and what is expected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from infergate.errors import InvalidInput, MalformedBody, PayloadTooLarge, UnsupportedMediaType

if TYPE_CHECKING:
    from infergate.routing import ServedModel
    from infergate.runtime import ModelRuntime, Prediction

ALLOWED_KEYS = frozenset({"inputs", "parameters"})
PARAMETERS = {"normalize": bool}
EXAMPLE = '{"inputs": "I love this film"} or {"inputs": ["first text", "second text"]}'


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int
    max_texts: int
    max_chars_per_text: int


@dataclass(frozen=True)
class PredictRequest:
    """What any protocol's body asks for; ``model`` where the body names it (OpenAI's)
    rather than the path."""

    texts: list[str]
    parameters: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # the protocol's own options


@dataclass(frozen=True)
class Answer:
    """A prediction, with what a protocol's renderer needs to shape its reply."""

    model: ServedModel
    runtime: ModelRuntime
    prediction: Prediction
    request: PredictRequest


Parse = Callable[[bytes, Limits], PredictRequest]
Render = Callable[[Answer], Any]  # the JSON body
# A protocol's own refusals of the version picked to answer, before it runs (OpenAI's
# embeddings refuse a classifier, or more dimensions than the model has).
Check = Callable[[PredictRequest, "ModelRuntime"], None]


def check_content_type(content_type: str | None) -> None:
    """JSON only; a missing header is taken as JSON (as most HTTP clients send it)."""
    if not content_type:
        return
    media_type, _, options = content_type.partition(";")
    media_type = media_type.strip().lower()
    if media_type == "application/json" or media_type.endswith("+json"):
        # JSON is UTF-8 (RFC 8259); a body announced in another charset is not read as one.
        charset = _charset(options)
        if charset in (None, "utf-8", "utf8", "us-ascii"):  # ASCII is UTF-8 too
            return
        raise UnsupportedMediaType(f"charset {charset!r} is not supported; send UTF-8 JSON")
    raise UnsupportedMediaType(
        f"content type {media_type!r} is not supported; send JSON with "
        "'content-type: application/json'"
    )


def _charset(options: str) -> str | None:
    for option in options.split(";"):
        key, _, value = option.partition("=")
        if key.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


def parse_predict(body: bytes, limits: Limits) -> PredictRequest:
    """Turn the raw body of a predict call into texts, or raise a typed error."""
    payload = json_object(body, limits, EXAMPLE)
    refuse_unknown_fields(payload, ALLOWED_KEYS)
    if "inputs" not in payload:
        raise InvalidInput(f"field 'inputs' is missing; expected {EXAMPLE}", param="inputs")
    texts = validate_texts(payload["inputs"], limits, "inputs")
    return PredictRequest(texts=texts, parameters=_parameters(payload.get("parameters")))


def json_object(body: bytes, limits: Limits, example: str) -> dict[str, Any]:
    """The body as a JSON object, or a typed error naming what was wrong with it (size,
    emptiness, encoding, syntax, shape); ``example`` shows a good body."""
    if len(body) > limits.max_body_bytes:
        raise PayloadTooLarge(
            f"request body is {len(body)} bytes; the limit is {limits.max_body_bytes} bytes"
        )
    if not body.strip():
        raise MalformedBody(f"request body is empty; expected JSON such as {example}")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedBody(
            f"request body is not valid UTF-8 (bad byte at offset {exc.start})"
        ) from None
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedBody(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidInput(f"expected a JSON object such as {example}, got {json_type(payload)}")
    return payload


def refuse_unknown_fields(payload: dict[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(payload) - allowed)
    if unknown:
        known = ", ".join(repr(key) for key in sorted(allowed))
        raise InvalidInput(
            f"unknown field(s) {unknown}; allowed fields are {known}", param=unknown[0]
        )


def validate_texts(inputs: Any, limits: Limits, field: str) -> list[str]:
    """One text or a list of texts, each a non-blank string within the limits; errors
    name the body's ``field`` (``'inputs[2]'``)."""
    if isinstance(inputs, str):
        texts = [inputs]
    elif isinstance(inputs, list):
        if not inputs:
            raise InvalidInput(f"'{field}' is an empty list; send at least one text", param=field)
        if len(inputs) > limits.max_texts:
            raise PayloadTooLarge(
                f"'{field}' holds {len(inputs)} texts; the limit is {limits.max_texts} per request",
                param=field,
            )
        texts = inputs
    else:
        raise InvalidInput(
            f"'{field}' must be a string or a list of strings, got {json_type(inputs)}",
            param=field,
        )
    for index, text in enumerate(texts):
        where = f"'{field}'" if isinstance(inputs, str) else f"'{field}[{index}]'"
        if not isinstance(text, str):
            raise InvalidInput(f"{where} must be a string, got {json_type(text)}", param=field)
        if not text or text.isspace():  # the model would see [CLS] [SEP] alone
            raise InvalidInput(f"{where} is empty or only whitespace; send some text", param=field)
        if len(text) > limits.max_chars_per_text:
            raise PayloadTooLarge(
                f"{where} has {len(text)} characters; the limit is "
                f"{limits.max_chars_per_text} per text",
                param=field,
            )
    return texts


def _parameters(parameters: Any) -> dict[str, Any]:
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidInput(
            f"'parameters' must be an object, got {json_type(parameters)}", param="parameters"
        )
    for key, value in parameters.items():
        expected = PARAMETERS.get(key)
        if expected is None:
            raise InvalidInput(
                f"unknown parameter {key!r}; known parameters are {sorted(PARAMETERS)}, all "
                "for embedding models"
            )
        if not isinstance(value, expected):
            raise InvalidInput(
                f"parameter {key!r} must be {expected.__name__}, got {json_type(value)}"
            )
    return parameters


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
