"""The wire format of the inference endpoint, and the checks every protocol's body goes
through: its size, its JSON, its texts and its parameters.

Pure: no Ray, no Triton. Every way a body can be wrong maps to one typed error
whose message says what was received and what is expected.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from infergate.errors import InvalidInput, MalformedBody, PayloadTooLarge, UnsupportedMediaType
from infergate.observe.metrics import COLD_START_HEADER, TOTAL
from infergate.serving.prompts import PROMPT_NAME
from infergate.tasks import TASKS

if TYPE_CHECKING:
    from infergate.serving.routing import ServedModel
    from infergate.serving.runtime import ModelRuntime, Prediction

# Every task's request parameters (infergate.tasks); a model refuses those of others.
# ``prompt_name`` picks a named prompt of the version, for any task's model registered with
# prompts (infergate.serving.prompts).
PARAMETERS = {key: kind for task in TASKS.values() for key, kind in task.parameters.items()}
PARAMETERS[PROMPT_NAME] = str
EXAMPLE = '{"inputs": "I love this film"} or {"inputs": ["first text", "second text"]}'


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int
    max_texts: int
    max_chars_per_text: int


BodyT = TypeVar("BodyT", bound="Body")


class Body(BaseModel):
    """A protocol's request body, declared once: its fields (names, types, defaults,
    descriptions) are the body's schema in the OpenAPI document, and :meth:`parse` reads
    a body through it. ``check`` gives each mistake its own message and status before
    the fields are validated; unknown fields are refused first, naming the known ones."""

    model_config = ConfigDict(extra="forbid")
    example: ClassVar[str]  # a good body, shown by the messages about a bad one

    @classmethod
    def parse(cls: type[BodyT], body: bytes, limits: Limits) -> BodyT:
        return cls.parse_value(json_object(body, limits, cls.example), limits)

    @classmethod
    def parse_value(cls: type[BodyT], payload: dict[str, Any], limits: Limits) -> BodyT:
        """A JSON object already read (a body, or an object inside one) through the type."""
        refuse_unknown_fields(payload, frozenset(cls.model_fields))
        try:
            return cls.model_validate(payload, context=limits)
        except ValidationError as error:  # what ``check`` let through: never a 500
            raise InvalidInput(f"invalid body: {error.errors()[0]['msg']}") from None

    @classmethod
    def check(cls, payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
        """``payload`` with its values checked (and normalised), or a typed error."""
        return payload

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, payload: Any, info: ValidationInfo) -> Any:
        return cls.check(payload, info.context) if isinstance(info.context, Limits) else payload


class PredictBody(Body):
    """The native predict request."""

    example: ClassVar[str] = EXAMPLE
    inputs: str | list[str] = Field(
        description="One text, or a list of texts (one output per text).",
        examples=["I love this film", ["first text", "second text"]],
    )
    parameters: dict[str, bool | str | int] = Field(
        default_factory=dict,
        description="Optional, per task. feature-extraction: 'normalize' (default true) "
        "L2-normalises. text-classification: 'raw_scores' (default false): the logits "
        "instead of probabilities. text-ranking: 'query' (required), the query each text "
        "is scored against; 'raw_scores' (default false): log-odds instead of 0..1 scores. "
        "sparse-embedding: 'top_k', the k heaviest terms only. token-classification: "
        "'aggregation_strategy', none, simple (default), first, max or average. "
        "translation: 'beam_size' (1 to 8, default 1) and 'max_decoding_length' (1 to 512, "
        "default 128). Models registered with prompts: 'prompt_name', the prompt put "
        "before each text (default: the model's default prompt, if it has one).",
    )

    @classmethod
    def check(cls, payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
        if "inputs" not in payload:
            raise InvalidInput(f"field 'inputs' is missing; expected {EXAMPLE}", param="inputs")
        texts = validate_texts(payload["inputs"], limits, "inputs")
        parameters = check_parameters(
            payload.get("parameters"), PARAMETERS, "each for the models of some tasks"
        )
        return {"inputs": texts, "parameters": parameters}

    @property
    def texts(self) -> list[str]:
        return self.inputs if isinstance(self.inputs, list) else [self.inputs]


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
    request = PredictBody.parse(body, limits)
    return PredictRequest(texts=request.texts, parameters=request.parameters)


def check_body_size(body: bytes, limits: Limits) -> None:
    check_size(len(body), limits)


def check_size(size: int, limits: Limits) -> None:
    """A body (or a gRPC message) of ``size`` bytes within the limit, or a 413."""
    if size > limits.max_body_bytes:
        raise PayloadTooLarge(
            f"request body is {size} bytes; the limit is {limits.max_body_bytes} bytes"
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


def json_object(body: bytes, limits: Limits, example: str) -> dict[str, Any]:
    """The body as a JSON object within the size limit, or a typed error naming what was
    wrong with it; ``example`` shows a good body."""
    check_body_size(body, limits)
    payload = load_json(body, example)
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
    """One text or a list of texts in the body's ``field``, checked by ``check_texts``;
    errors name the field (``'inputs[2]'``)."""
    if isinstance(inputs, str):
        return check_texts([inputs], limits, f"'{field}'", lambda _: f"'{field}'", field)
    if isinstance(inputs, list):
        return check_texts(inputs, limits, f"'{field}'", lambda i: f"'{field}[{i}]'", field)
    raise InvalidInput(
        f"'{field}' must be a string or a list of strings, got {json_type(inputs)}", param=field
    )


def check_texts(
    texts: list[Any],
    limits: Limits,
    name: str,
    item: Callable[[int], str],
    param: str | None = None,
) -> list[str]:
    """``texts`` if they are what any protocol may send a model: at least one and at most
    ``max_texts`` strings, none blank, none over ``max_chars_per_text``. ``name`` names
    the list in messages, ``item(index)`` one of its texts, ``param`` the body's field."""
    check_text_count(len(texts), limits, name, param)
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInput(
                f"{item(index)} must be a string, got {json_type(text)}", param=param
            )
        if not text or text.isspace():  # the model would see [CLS] [SEP] alone
            raise InvalidInput(
                f"{item(index)} is empty or only whitespace; send some text", param=param
            )
        if len(text) > limits.max_chars_per_text:
            raise PayloadTooLarge(
                f"{item(index)} has {len(text)} characters; the limit is "
                f"{limits.max_chars_per_text} per text",
                param=param,
            )
        # After the length check (this one loops in Python): tokenizers drop control
        # characters, so the model would see [CLS] [SEP] alone again.
        if _only_control(text):
            raise InvalidInput(
                f"{item(index)} holds only control characters (such as NUL) and whitespace; "
                "send some text",
                param=param,
            )
    return texts


def _only_control(text: str) -> bool:
    """Whether ``text`` is made of control characters and whitespace alone (it stops at
    the first other character: a text's first, as a rule)."""
    return all(char.isspace() or unicodedata.category(char) == "Cc" for char in text)


def check_text_count(count: int, limits: Limits, name: str, param: str | None = None) -> None:
    """At least one text and at most ``max_texts``; a protocol that says how many texts
    it sends before sending them is refused here before they are read."""
    if count == 0:
        raise InvalidInput(f"{name} is an empty list; send at least one text", param=param)
    if count > limits.max_texts:
        raise PayloadTooLarge(
            f"{name} holds {count} texts; the limit is {limits.max_texts} per request", param=param
        )


def check_parameters(parameters: Any, known: Mapping[str, type], note: str = "") -> dict[str, Any]:
    """``parameters`` (absent: ``{}``) if it is an object of ``known`` names with values
    of their types; ``note`` ends the message naming the known ones."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidInput(
            f"'parameters' must be an object, got {json_type(parameters)}", param="parameters"
        )
    for key, value in parameters.items():
        expected = known.get(key)
        if expected is None:
            raise InvalidInput(
                f"unknown parameter {key!r}; known parameters are {sorted(known)}"
                + (f", {note}" if note else ""),
                param="parameters",
            )
        if not isinstance(value, expected):
            raise InvalidInput(
                f"parameter {key!r} must be {expected.__name__}, got {json_type(value)}",
                param="parameters",
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


def timing_headers(prediction: Prediction, total_s: float, runtime: ModelRuntime) -> dict[str, str]:
    """The version that answered, and each stage's milliseconds (response headers, or
    gRPC trailing metadata)."""
    headers = {"x-model-version": runtime.served.version, TOTAL.header: f"{total_s * 1e3:.3f}"}
    for stage, seconds in prediction.timings.stages():
        headers[stage.header] = f"{seconds * 1e3:.3f}"
    if prediction.cold_start_s:  # its version was loaded for it (load on demand)
        headers[COLD_START_HEADER] = f"{prediction.cold_start_s:.3f}"
    return headers
