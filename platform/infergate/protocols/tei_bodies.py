"""The request bodies of Text Embeddings Inference's API (``infergate.protocols.tei``),
each one type for parsing and for the OpenAPI document, as TEI's OpenAPI document
declares them, with Hugging Face inference API's ``parameters`` where
``huggingface_hub`` sends them to a TEI base URL."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from infergate.errors import InvalidInput
from infergate.protocols.rerank import RerankBody
from infergate.protocols.truncation import DIRECTION_FIELD, check_direction
from infergate.protocols.wire import Body, Limits, check_text_count, json_type, validate_texts
from infergate.serving.prompts import PROMPT_NAME

EMBED_EXAMPLE = '{"inputs": "What is Deep Learning?", "normalize": true}'
PREDICT_EXAMPLE = (
    '{"inputs": "I like you."}, {"inputs": [["I like you."], ["Not at all."]]} or, for a '
    'text-ranking model, {"inputs": [["a query", "a text"]]}'
)
SIMILARITY_EXAMPLE = (
    '{"inputs": {"source_sentence": "What is Deep Learning?", "sentences": ["Deep learning '
    'is...", "Cheese is..."]}}'
)
TOKENIZE_EXAMPLE = '{"inputs": "test", "add_special_tokens": true}'
DECODE_EXAMPLE = '{"ids": [101, 3231, 102]}'
# Hugging Face's inference API parameters huggingface_hub's text_classification sends.
FUNCTIONS = ("softmax", "none")

_PROMPT = Field(
    None,
    description="A prompt the model was registered with, put before each text; "
    "default: the model's default prompt, if it has one.",
)
_TRUNCATE = Field(
    None,
    description="Texts are truncated at the model's max length unless this is false, "
    "which refuses a text that is too long (413).",
)
_DIRECTION = DIRECTION_FIELD


def _texts(payload: dict[str, Any], limits: Limits, key: str = "inputs") -> list[str]:
    if key not in payload:
        raise InvalidInput(f"field {key!r} is missing", param=key)
    inputs = payload[key]
    if isinstance(inputs, list) and inputs and all(isinstance(i, int) for i in inputs):
        raise InvalidInput(
            f"'{key}' holds token ids; send text (the model tokenizes with its own tokenizer)",
            param=key,
        )
    return validate_texts(inputs, limits, key)


def _checked(payload: dict[str, Any], kinds: dict[str, tuple[type, ...]]) -> dict[str, Any]:
    """Each optional field of ``kinds`` present in ``payload`` if of one of its types
    (None: left out), with TEI's options' own checks."""
    checked: dict[str, Any] = {}
    for key, types in kinds.items():
        value = payload.get(key)
        if value is None:
            continue
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            expected = " or ".join(t.__name__.replace("str", "string") for t in types)
            raise InvalidInput(f"{key!r} must be a {expected}, got {json_type(value)}", param=key)
        checked[key] = value
    check_direction(checked.get("truncation_direction"))
    dimensions = checked.get("dimensions")
    if dimensions is not None and dimensions < 1:
        raise InvalidInput(f"'dimensions' must be at least 1, got {dimensions}", param="dimensions")
    return checked


_TEXT_OPTIONS: dict[str, tuple[type, ...]] = {
    "truncate": (bool,),
    "truncation_direction": (str,),
    PROMPT_NAME: (str,),
}


class TeiEmbedBody(Body):
    """TEI's embed request (``/embed``; ``POST /`` of an embedding model)."""

    example: ClassVar[str] = EMBED_EXAMPLE
    inputs: str | list[str] = Field(description="One text, or a list (one vector each).")
    normalize: bool = Field(True, description="Scale each vector to unit length.")
    truncate: bool | None = _TRUNCATE
    truncation_direction: str = _DIRECTION
    prompt_name: str | None = _PROMPT
    dimensions: int | None = Field(
        None, ge=1, description="Keep the first dimensions (then normalise, if asked)."
    )
    encoding_format: Literal["float"] = Field(
        "float", description="Sent by huggingface_hub; float only (base64: /v1/embeddings)."
    )

    @classmethod
    def check(cls, payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
        checked = _checked(payload, {**_TEXT_OPTIONS, "normalize": (bool,), "dimensions": (int,)})
        encoding = payload.get("encoding_format")
        if encoding not in (None, "float"):
            raise InvalidInput(
                f"'encoding_format' {encoding!r} is not offered here; TEI's routes answer "
                "floats (base64: POST /openai/v1/embeddings)",
                param="encoding_format",
            )
        return {"inputs": _texts(payload, limits), **checked}


class TeiSparseBody(Body):
    """TEI's sparse embedding request (``/embed_sparse``)."""

    example: ClassVar[str] = '{"inputs": "What is Deep Learning?"}'
    inputs: str | list[str] = Field(description="One text, or a list (one vector each).")
    truncate: bool | None = _TRUNCATE
    truncation_direction: str = _DIRECTION
    prompt_name: str | None = _PROMPT

    @classmethod
    def check(cls, payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
        return {"inputs": _texts(payload, limits), **_checked(payload, _TEXT_OPTIONS)}


class TeiEmbedAllBody(TeiSparseBody):
    """TEI's per-token embedding request (``/embed_all``): checked, then refused, as no
    served graph gives its token vectors out."""


class ClassificationParameters(Body):
    """Hugging Face inference API's options, as ``huggingface_hub`` sends them."""

    example: ClassVar[str] = '{"top_k": 1}'
    top_k: int | None = Field(None, ge=1, description="The best k labels only.")
    function_to_apply: Literal["softmax", "none"] | None = Field(
        None, description="none: the logits (as raw_scores)."
    )

    @classmethod
    def check(cls, payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
        checked = _checked(payload, {"top_k": (int,), "function_to_apply": (str,)})
        if checked.get("top_k", 1) < 1:
            raise InvalidInput(f"'top_k' must be at least 1, got {checked['top_k']}", param="top_k")
        function = checked.get("function_to_apply")
        if function is not None and function not in FUNCTIONS:
            raise InvalidInput(
                f"'function_to_apply' {function!r} is not offered; use 'softmax' (the "
                "default) or 'none' (the logits)",
                param="parameters",
            )
        return checked


class TeiPredictBody(Body):
    """TEI's predict request (``/predict``; ``POST /`` of a classifier): one text, one
    pair of texts, or a batch of one-text or two-text lists. A classifier reads texts, a
    text-ranking model (cross-encoder) pairs; a batch holds one kind or the other."""

    example: ClassVar[str] = PREDICT_EXAMPLE
    inputs: str | list[str] | list[list[str]] = Field(
        description='"text" or ["text"] (answer: a list of labels), ["query", "text"] (a '
        'pair), or a batch, [["t1"], ["t2"]] or [["q1", "t1"], ["q2", "t2"]] (a list each).'
    )
    raw_scores: bool = Field(False, description="The logits instead of probabilities.")
    truncate: bool | None = _TRUNCATE
    truncation_direction: str = _DIRECTION
    parameters: ClassificationParameters | None = None

    @classmethod
    def check(cls, payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
        checked = _checked(
            payload, {"raw_scores": (bool,), "truncate": (bool,), "truncation_direction": (str,)}
        )
        checked["inputs"] = _predict_inputs(payload, limits)
        parameters = payload.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, dict):
                raise InvalidInput(
                    f"'parameters' must be an object, got {json_type(parameters)}",
                    param="parameters",
                )
            checked["parameters"] = ClassificationParameters.parse_value(parameters, limits)
        return checked


def _predict_inputs(payload: dict[str, Any], limits: Limits) -> str | list[str] | list[list[str]]:
    """TEI's predict inputs, as its router reads them: a string or a list of one or two
    strings is one input; a list of such lists a batch. ``["t"]`` comes back as ``"t"``."""
    inputs = payload.get("inputs")
    if isinstance(inputs, list) and inputs and all(isinstance(item, list) for item in inputs):
        check_text_count(len(inputs), limits, "'inputs'", "inputs")
        sizes = {len(item) for item in inputs}
        for index, item in enumerate(inputs):
            if len(item) not in (1, 2):
                raise InvalidInput(
                    f"'inputs[{index}]' holds {len(item)} texts; each item of a batch is "
                    f"one text or a pair of texts: {PREDICT_EXAMPLE}",
                    param="inputs",
                )
        if len(sizes) > 1:
            raise InvalidInput(
                "'inputs' mixes single texts and pairs; a model reads one or the other "
                "(a classifier texts, a text-ranking model pairs): send them apart",
                param="inputs",
            )
        (size,) = sizes
        columns = [
            validate_texts([item[i] for item in inputs], limits, "inputs") for i in range(size)
        ]
        return [list(row) for row in zip(*columns, strict=True)]
    if isinstance(inputs, list) and inputs and all(isinstance(item, str) for item in inputs):
        if len(inputs) > 2:
            raise InvalidInput(
                f"'inputs' is a list of {len(inputs)} strings; TEI reads a list of strings as "
                f"one text or a pair of texts; send a batch as a list of lists: "
                f"{PREDICT_EXAMPLE}",
                param="inputs",
            )
        texts = validate_texts(inputs, limits, "inputs")
        return texts[0] if len(texts) == 1 else texts
    return _texts(payload, limits)[0]


class SimilarityInputs(Body):
    example: ClassVar[str] = SIMILARITY_EXAMPLE
    source_sentence: str = Field(description="The text the others are compared with.")
    sentences: list[str] = Field(description="The texts compared with it.")


class SimilarityParameters(Body):
    example: ClassVar[str] = '{"prompt_name": "query"}'
    truncate: bool | None = _TRUNCATE
    truncation_direction: str = _DIRECTION
    prompt_name: str | None = _PROMPT


class TeiSimilarityBody(Body):
    """TEI's similarity request (``/similarity``; ``POST /`` of an embedding model with
    ``inputs`` an object, as ``huggingface_hub``'s sentence_similarity sends): the cosine
    of each sentence's embedding with the source sentence's."""

    example: ClassVar[str] = SIMILARITY_EXAMPLE
    inputs: SimilarityInputs
    parameters: SimilarityParameters | None = None

    @classmethod
    def check(cls, payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
        inputs = payload.get("inputs")
        if not isinstance(inputs, dict):
            raise InvalidInput(
                f"'inputs' must be an object, got {json_type(inputs)}; expected "
                f"{SIMILARITY_EXAMPLE}",
                param="inputs",
            )
        for key in ("source_sentence", "sentences"):
            if key not in inputs:
                raise InvalidInput(f"field 'inputs.{key}' is missing", param="inputs")
        source = validate_texts(inputs["source_sentence"], limits, "inputs.source_sentence")
        if not isinstance(inputs["sentences"], list):
            raise InvalidInput("'inputs.sentences' must be a list of strings", param="inputs")
        sentences = validate_texts(inputs["sentences"], limits, "inputs.sentences")
        check_text_count(len(sentences) + 1, limits, "'inputs' (with the source)", "inputs")
        parameters = payload.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise InvalidInput("'parameters' must be an object", param="parameters")
        checked = SimilarityParameters.parse_value(parameters, limits)
        return {
            "inputs": {"source_sentence": source[0], "sentences": sentences},
            "parameters": checked,
        }


class TeiModelRerankBody(RerankBody):
    """TEI's rerank request under a model's base URL (``/rerank``; ``POST /`` of a
    text-ranking model)."""

    truncate: bool | None = _TRUNCATE
    truncation_direction: str = _DIRECTION

    @classmethod
    def check(cls, payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
        options = _checked(payload, {"truncate": (bool,), "truncation_direction": (str,)})
        rest = {k: v for k, v in payload.items() if k not in ("truncate", "truncation_direction")}
        return {**RerankBody.check(rest, limits), **options}


class EntitiesParameters(Body):
    example: ClassVar[str] = '{"aggregation_strategy": "simple"}'
    aggregation_strategy: str | None = Field(
        None, description="none, simple (default), first, max or average."
    )
    ignore_labels: list[str] | None = Field(None, description="Entity types to leave out.")


class EntitiesBody(Body):
    """Hugging Face inference API's token-classification request (``POST /`` of a
    token-classification model, which TEI does not serve), as huggingface_hub sends it."""

    example: ClassVar[str] = '{"inputs": "My name is Wolfgang and I live in Berlin"}'
    inputs: str | list[str] = Field(description="One text (a list of entities) or a list.")
    parameters: EntitiesParameters | None = None

    @classmethod
    def check(cls, payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
        parameters = payload.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise InvalidInput("'parameters' must be an object", param="parameters")
        if parameters.get("stride") is not None:
            raise InvalidInput(
                "'stride' is not supported: texts are truncated at the model's max length",
                param="parameters",
            )
        parameters = {k: v for k, v in parameters.items() if k != "stride"}
        texts = _texts(payload, limits)
        return {
            # One text answers its entities alone, as Hugging Face's inference API does.
            "inputs": texts[0] if isinstance(payload["inputs"], str) else texts,
            "parameters": EntitiesParameters.parse_value(parameters, limits),
        }


class TokenizeBody(Body):
    """TEI's tokenize request: each text's tokens as the model sees them."""

    example: ClassVar[str] = TOKENIZE_EXAMPLE
    inputs: str | list[str] = Field(description="One text, or a list.")
    add_special_tokens: bool = Field(True, description="With [CLS], [SEP] and the like.")
    prompt_name: str | None = _PROMPT

    @classmethod
    def check(cls, payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
        checked = _checked(payload, {"add_special_tokens": (bool,), PROMPT_NAME: (str,)})
        return {"inputs": _texts(payload, limits), **checked}


class DecodeBody(Body):
    """TEI's decode request: token ids back to text."""

    example: ClassVar[str] = DECODE_EXAMPLE
    ids: list[int] | list[list[int]] = Field(description="One text's ids, or a list of them.")
    skip_special_tokens: bool = Field(True, description="Leave [CLS], [SEP]... out.")

    @classmethod
    def check(cls, payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
        ids = payload.get("ids")
        rows = ids if isinstance(ids, list) and ids and isinstance(ids[0], list) else [ids]
        for row in rows:
            if not isinstance(row, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in row
            ):
                raise InvalidInput(
                    f"'ids' must be a list of token ids (whole numbers from 0), or a list "
                    f"of such lists; expected {DECODE_EXAMPLE}",
                    param="ids",
                )
        check_text_count(len(rows), limits, "'ids'", "ids")
        return {"ids": ids, **_checked(payload, {"skip_special_tokens": (bool,)})}
