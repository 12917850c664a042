"""The rerank endpoints of text-ranking models (cross-encoders).

``POST /v1/models/{name}/rerank`` takes ``{"query": "...", "texts": [...], "top_n": k,
"return_text": bool, "raw_scores": bool}`` and answers ``{"model", "version", "results":
[{"index", "score", "text"?}]}``, best first. ``POST /rerank`` takes the same body (with
an optional ``"model"``; without one, the only served text-ranking model answers; and
TEI's ``"truncation_direction"``) and answers the bare list of results, as Hugging Face's
Text Embeddings Inference does
(https://huggingface.github.io/text-embeddings-inference/#/Text%20Embeddings%20Inference/rerank).

Pure: parse, check and render plug into ``Frontend.serve_inference``, so routing,
canaries, metrics and headers are the predict endpoint's; the query gets the limits of
a text. Each text is scored as the pair (query, text) (``infergate.tasks.ranking``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from infergate.errors import InvalidInput
from infergate.protocols.truncation import DIRECTION_FIELD, check_direction, direction_parameter
from infergate.protocols.wire import (
    Answer,
    Body,
    Limits,
    PredictRequest,
    check_texts,
    json_type,
    validate_texts,
)
from infergate.tasks import TASKS
from infergate.tasks.ranking import ranked

if TYPE_CHECKING:
    from infergate.serving.runtime import ModelRuntime

EXAMPLE = '{"query": "What is Deep Learning?", "texts": ["Deep learning is...", "Cheese is..."]}'


class RerankBody(Body):
    """A rerank request: a query and the texts to rank against it."""

    example: ClassVar[str] = EXAMPLE
    query: str = Field(examples=["What is Deep Learning?"])
    texts: list[str] = Field(description="The texts to rank against the query.")
    top_n: int | None = Field(None, ge=1, description="Return the best n only.")
    return_text: bool = Field(False, description="Include each text in its result.")
    raw_scores: bool = Field(False, description="Log-odds instead of 0..1 scores.")

    @classmethod
    def check(cls, payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
        for key in ("query", "texts"):
            if key not in payload:
                raise InvalidInput(f"field {key!r} is missing; expected {EXAMPLE}", param=key)
        query = payload["query"]
        if not isinstance(query, str):
            raise InvalidInput(f"'query' must be a string, got {json_type(query)}", param="query")
        check_texts([query], limits, "'query'", lambda _: "'query'", "query")
        texts = payload["texts"]
        if not isinstance(texts, list):
            raise InvalidInput(
                f"'texts' must be a list of strings, got {json_type(texts)}", param="texts"
            )
        checked: dict[str, Any] = {"query": query, "texts": validate_texts(texts, limits, "texts")}
        top_n = payload.get("top_n")
        if top_n is not None and (
            not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1
        ):
            raise InvalidInput(f"'top_n' must be a positive integer, got {top_n!r}", param="top_n")
        checked["top_n"] = top_n
        for key in ("return_text", "raw_scores", "truncate"):
            value = payload.get(key, False)
            if not isinstance(value, bool):
                raise InvalidInput(f"{key!r} must be a boolean, got {json_type(value)}", param=key)
            if key in cls.model_fields:
                checked[key] = value
        if "model" in cls.model_fields:
            model = payload.get("model")
            if model is not None and not isinstance(model, str):
                raise InvalidInput(
                    f"'model' must be a string, got {json_type(model)}", param="model"
                )
            checked["model"] = model
        if "truncation_direction" in cls.model_fields:
            direction = check_direction(payload.get("truncation_direction"))
            if direction is not None:
                checked["truncation_direction"] = direction
        return checked


class TeiRerankBody(RerankBody):
    """TEI's rerank request: the same, the model it names (without one, the only
    text-ranking model served) and which end of a long text is cut. Texts are always
    truncated here, at the model's max length, longest of the pair first."""

    model: str | None = Field(
        None, description="The text-ranking model; without it, the only one served."
    )
    truncate: bool = Field(False, description="Accepted; texts are always truncated.")
    truncation_direction: str = DIRECTION_FIELD


def rerank_parser(with_model: bool, default: Callable[[], str | None] | None = None) -> Any:
    """The parser of a rerank body; ``with_model``: the body may name its model (``/rerank``),
    else ``default()`` names it (the only served text-ranking model, if there is one)."""

    def parse(body: bytes, limits: Limits) -> PredictRequest:
        request = (TeiRerankBody if with_model else RerankBody).parse(body, limits)
        model = request.model if isinstance(request, TeiRerankBody) else None
        if with_model and model is None and default is not None:
            model = default()
        if with_model and model is None:
            raise InvalidInput(
                "name the model: the body's 'model' (more than one text-ranking model, or "
                "none, is served)",
                param="model",
            )
        parameters: dict[str, Any] = {"query": request.query}
        if isinstance(request, TeiRerankBody):
            parameters.update(direction_parameter(request.truncation_direction))
        if request.raw_scores:
            parameters["raw_scores"] = True
        extra = {"top_n": request.top_n, "return_text": request.return_text}
        return PredictRequest(texts=request.texts, parameters=parameters, model=model, extra=extra)

    return parse


def reranks(task: str) -> bool:
    """Whether models of ``task`` answer rerank requests."""
    return TASKS[task].reranks


def refuse_unless_ranking(request: PredictRequest, runtime: ModelRuntime) -> None:
    if not reranks(runtime.spec.task):
        ranking = " or ".join(task.name for task in TASKS.values() if task.reranks)
        raise InvalidInput(
            f"model {runtime.served.name!r} is a {runtime.spec.task} model and ranks nothing; "
            f"rerank needs a {ranking} model (GET /v1/models shows each model's task)",
            param="model",
        )


def _results(answer: Answer) -> list[dict[str, Any]]:
    scores = [output["score"] for output in answer.prediction.outputs]
    extra = answer.request.extra
    return ranked(scores, answer.request.texts, extra["top_n"], extra["return_text"])


def render_rerank(answer: Answer) -> dict[str, Any]:
    """``{"model", "version", "results"}``, the results best first."""
    return {
        "model": answer.model.name,
        "version": answer.runtime.served.version,
        "results": _results(answer),
    }


def render_tei_rerank(answer: Answer) -> list[dict[str, Any]]:
    """TEI's shape: the bare list of results, best first."""
    return _results(answer)
