"""The wire format of the inference endpoint, and the checks every protocol's body goes
through: its size, its JSON, its texts and its parameters.

Pure: no Ray, no Triton. Every way a body can be wrong maps to one typed error
whose message says what was received and what is expected.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
# The JSON body, or a whole Response where the protocol's body is not JSON alone (KServe
# V2's binary tensors).
Render = Callable[[Answer], Any]


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
    check_body_size(body, limits)
    payload = load_json(body, EXAMPLE)
    if not isinstance(payload, dict):
        raise InvalidInput(f"expected a JSON object such as {EXAMPLE}, got {json_type(payload)}")
    unknown = sorted(set(payload) - ALLOWED_KEYS)
    if unknown:
        raise InvalidInput(f"unknown field(s) {unknown}; allowed fields are 'inputs', 'parameters'")
    if "inputs" not in payload:
        raise InvalidInput(f"field 'inputs' is missing; expected {EXAMPLE}")
    texts = _texts(payload["inputs"], limits)
    return PredictRequest(texts=texts, parameters=_parameters(payload.get("parameters")))


def check_body_size(body: bytes, limits: Limits) -> None:
    if len(body) > limits.max_body_bytes:
        raise PayloadTooLarge(
            f"request body is {len(body)} bytes; the limit is {limits.max_body_bytes} bytes"
        )


def load_json(body: bytes, example: str) -> Any:
    """The JSON value of ``body``; an empty body, invalid UTF-8 or broken JSON is a 400
    whose message shows ``example``."""
    if not body.strip():
        raise MalformedBody(f"request body is empty; expected JSON such as {example}")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedBody(
            f"request body is not valid UTF-8 (bad byte at offset {exc.start})"
        ) from None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedBody(f"request body is not valid JSON: {exc}") from None


def _texts(inputs: Any, limits: Limits) -> list[str]:
    if isinstance(inputs, str):
        return check_texts([inputs], limits, "'inputs'", lambda index: "'inputs'")
    if isinstance(inputs, list):
        return check_texts(inputs, limits, "'inputs'", lambda index: f"'inputs[{index}]'")
    raise InvalidInput(f"'inputs' must be a string or a list of strings, got {json_type(inputs)}")


def check_texts(
    texts: list[Any], limits: Limits, name: str, item: Callable[[int], str]
) -> list[str]:
    """``texts`` if they are what any protocol may send a model: at least one and at most
    ``max_texts`` strings, none blank, none over ``max_chars_per_text``. ``name`` names
    the list in messages, ``item(index)`` one of its texts."""
    check_text_count(len(texts), limits, name)
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInput(f"{item(index)} must be a string, got {json_type(text)}")
        if not text or text.isspace():  # the model would see [CLS] [SEP] alone
            raise InvalidInput(f"{item(index)} is empty or only whitespace; send some text")
        if len(text) > limits.max_chars_per_text:
            raise PayloadTooLarge(
                f"{item(index)} has {len(text)} characters; the limit is "
                f"{limits.max_chars_per_text} per text"
            )
    return texts


def check_text_count(count: int, limits: Limits, name: str) -> None:
    """At least one text and at most ``max_texts``; a protocol that says how many texts
    it sends before sending them is refused here before they are read."""
    if count == 0:
        raise InvalidInput(f"{name} is an empty list; send at least one text")
    if count > limits.max_texts:
        raise PayloadTooLarge(
            f"{name} holds {count} texts; the limit is {limits.max_texts} per request"
        )


def _parameters(parameters: Any) -> dict[str, Any]:
    return check_parameters(parameters, PARAMETERS, "all for embedding models")


def check_parameters(parameters: Any, known: Mapping[str, type], note: str = "") -> dict[str, Any]:
    """``parameters`` (absent: ``{}``) if it is an object of ``known`` names with values
    of their types; ``note`` ends the message naming the known ones."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidInput(f"'parameters' must be an object, got {json_type(parameters)}")
    for key, value in parameters.items():
        expected = known.get(key)
        if expected is None:
            raise InvalidInput(
                f"unknown parameter {key!r}; known parameters are {sorted(known)}"
                + (f", {note}" if note else "")
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
