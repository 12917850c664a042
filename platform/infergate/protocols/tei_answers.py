"""Answers in Text Embeddings Inference's shapes, its refusals and its error body; the
requests are ``infergate.protocols.tei``'s.

TEI answers a route its model's task does not serve with a 424 (``WrongTask``) and every
error as ``{"error": message, "error_type": kind}``, kind one of TEI's: validation,
tokenizer, backend, overloaded, unhealthy. The statuses stay the platform's (422 for a
body of the wrong shape, 404 for an unknown model...), as on every other route.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from infergate import __version__
from infergate.errors import InfergateError, InvalidInput, PayloadTooLarge, WrongTask
from infergate.protocols.rerank import render_tei_rerank
from infergate.protocols.wire import Answer, Limits, PredictRequest
from infergate.serving.postprocess import l2_normalize
from infergate.serving.prompts import prompt_for, prompted
from infergate.tasks import TASKS, heads

if TYPE_CHECKING:
    from infergate.serving.routing import ServedModel
    from infergate.serving.runtime import ModelRuntime
    from infergate.serving.tokenization import TextTokenizer

# What TEI's ``/info`` calls each route's model (its ``model_type``).
MODEL_TYPES = {
    "embed": "embedding",
    "embed_sparse": "embedding",
    "predict": "classifier",
    "rerank": "reranker",
    "entities": "classifier",
}
POOLING = {heads.MEAN_POOL: "mean", heads.SPLADE: "splade"}  # TEI's names


def error_body(error: InfergateError) -> dict[str, Any]:
    return {"error": error.message, "error_type": error_type(error.status)}


def error_type(status: int) -> str:
    """TEI's kind of error for a status."""
    if status == 429:
        return "overloaded"
    if status == 503:
        return "unhealthy"
    if status >= 500 or status == WrongTask.status:
        return "backend"
    return "validation"


def refuse_unless(route: str) -> Callable[[PredictRequest, ModelRuntime], None]:
    """The check of a TEI route: the version picked must be of a task the route serves
    (``/similarity`` is the embedding models')."""
    serving = "embed" if route == "similarity" else route

    def check(request: PredictRequest, runtime: ModelRuntime) -> None:
        task = runtime.task
        if request.extra.get("pairs"):
            _refuse_unless_pairs(runtime)
        elif task.tei_route != serving:
            tasks = " or ".join(t.name for t in TASKS.values() if t.tei_route == serving)
            raise WrongTask(
                f"model {runtime.served.name!r} is a {task.name} model; /{route} needs a "
                f"{tasks} model (GET .../info says what this one is; its route is "
                f"{'/' + task.tei_route if task.tei_route else 'none'})"
            )
        dimensions = request.extra.get("dimensions")
        if dimensions is not None and dimensions > runtime.spec.output_dim:
            raise InvalidInput(
                f"'dimensions' is {dimensions}, but model {runtime.served.name!r} makes "
                f"vectors of {runtime.spec.output_dim}; ask for 1 to {runtime.spec.output_dim}",
                param="dimensions",
            )

    return check


def _refuse_unless_pairs(runtime: ModelRuntime) -> None:
    """Text pairs on ``/predict`` are for a model that reads pairs (a cross-encoder); a
    classifier here reads one text, its graph numbering every token as the first text's."""
    task = runtime.task
    if not task.pairs:
        readers = " or ".join(t.name for t in TASKS.values() if t.pairs)
        raise InvalidInput(
            f"model {runtime.served.name!r} is a {task.name} model, which reads one text; "
            f"text pairs need a {readers} model (a cross-encoder); send one text, or a "
            'batch of one-text lists: [["t1"], ["t2"]]',
            param="inputs",
        )


def refuse_embed_all(request: PredictRequest, runtime: ModelRuntime) -> None:
    """``/embed_all`` (one vector per token) cannot be answered truthfully: every served
    graph ends with its task's head (``infergate.tasks.heads``), so the token vectors
    never leave Triton. Refused as TEI refuses a model that lacks them, after the body
    and the model were checked."""
    task, name = runtime.task, runtime.served.name
    if task.tei_route == "embed":
        why = (
            f"its served graph pools the tokens inside ({POOLING.get(task.head, task.head)} "
            "pooling), so per-token embeddings are not among its outputs; /embed answers "
            "the pooled vector"
        )
    else:
        why = f"a {task.name} model answers no embeddings"
    raise WrongTask(f"model {name!r} cannot answer /embed_all: {why}")


def _refuse_truncated(answer: Answer) -> None:
    """``"truncate": false`` refuses a text longer than the model takes, as TEI does."""
    if answer.request.extra.get("truncate") is not False:
        return
    cut = np.flatnonzero(answer.prediction.batch.truncated)
    if cut.size:
        limit = answer.runtime.spec.max_length
        raise PayloadTooLarge(
            f"text {int(cut[0])} is longer than the model's {limit} tokens; send "
            '"truncate": true to have it cut, or a shorter text',
            param="inputs",
        )


def render_embed(answer: Answer) -> Any:
    """One vector per text (``/embed``), or the cosines of ``/similarity``."""
    _refuse_truncated(answer)
    extra = answer.request.extra
    raw = np.asarray(answer.prediction.raw)
    if extra["route"] == "similarity":
        vectors = l2_normalize(raw)
        return (vectors[1:] @ vectors[0]).astype(np.float32)
    dimensions = extra.get("dimensions")
    if dimensions is not None:
        raw = raw[:, :dimensions]
    vectors = l2_normalize(raw) if extra.get("normalize", True) else raw
    return np.ascontiguousarray(vectors, dtype=np.float32)


def render_sparse(answer: Answer) -> list[list[dict[str, Any]]]:
    """Each text's non-zero terms, ``[{"index", "value"}]`` in the order of the index."""
    _refuse_truncated(answer)
    return [
        [{"index": i, "value": v} for i, v in sorted(zip(o["indices"], o["values"], strict=True))]
        for o in answer.prediction.outputs
    ]


def render_predict(answer: Answer) -> list[Any]:
    """Each text's labels, best first (the ``top_k`` best); one text's list alone for a
    request of one text."""
    _refuse_truncated(answer)
    extra = answer.request.extra
    ranked = [
        [
            {"label": label, "score": score}
            for label, score in sorted(_scores(output, answer), key=lambda item: -item[1])
        ][: extra.get("top_k")]
        for output in answer.prediction.outputs
    ]
    return ranked[0] if extra.get("single") else ranked


def _scores(output: dict[str, Any], answer: Answer) -> list[tuple[str, float]]:
    """A classifier's scores by label; a pair's one relevance score, under the label the
    model's config names its output (TEI's ``LABEL_0`` when it kept none)."""
    if "scores" in output:
        return list(output["scores"].items())
    labels = answer.runtime.spec.labels
    return [(labels[-1] if labels else "LABEL_0", output["score"])]


def render_rerank(answer: Answer) -> list[dict[str, Any]]:
    _refuse_truncated(answer)
    return render_tei_rerank(answer)


def render_entities(answer: Answer) -> list[Any]:
    """Hugging Face's inference API shape: each entity's ``entity_group`` (``entity``
    with no aggregation), ``score``, ``word``, ``start`` and ``end``."""
    extra = answer.request.extra
    grouped = answer.request.parameters.get("aggregation_strategy", "simple") != "none"
    texts = []
    for entities in answer.prediction.outputs:
        kept = []
        for entity in entities:
            if entity["entity"] in extra["ignore"]:
                continue
            item = {k: v for k, v in entity.items() if k != "entity"}
            item["entity_group" if grouped else "entity"] = entity["entity"]
            kept.append(item)
        texts.append(kept)
    return texts[0] if extra.get("single") else texts


RENDERERS: dict[str, Callable[[Answer], Any]] = {
    "embed": render_embed,
    "similarity": render_embed,
    "embed_sparse": render_sparse,
    "predict": render_predict,
    "rerank": render_rerank,
    "entities": render_entities,
}


def render(answer: Answer) -> Any:
    """The answer of whichever TEI route the request came by (its parser names it)."""
    return RENDERERS[answer.request.extra["route"]](answer)


# -- the routes without inference -----------------------------------------------------------


def tokenize(
    runtime: ModelRuntime, texts: list[str], add_special_tokens: bool, prompt_name: str | None
) -> list[list[dict[str, Any]]]:
    """TEI's tokens, ``{"id", "text", "special", "start", "stop"}``, of each text as the
    version's model sees it: its prompt first, if the request or the model names one (the
    span in characters is in that text), truncated at the model's max length."""
    prompt = prompt_for(runtime.spec, prompt_name, runtime.served.name)
    return [
        [
            {"id": t.id, "text": t.text, "special": t.special, "start": t.start, "stop": t.end}
            for t in tokens
        ]
        for tokens in runtime.tokenizer.tokens(prompted(texts, prompt), add_special_tokens)
    ]


def decode(tokenizer: TextTokenizer, ids: list[Any], skip_special_tokens: bool) -> list[str]:
    """The text of each list of ids."""
    rows = ids if ids and isinstance(ids[0], list) else [ids]
    return tokenizer.decode_batch(rows, skip_special_tokens)


def info(model: ServedModel, runtime: ModelRuntime, limits: Limits) -> dict[str, Any]:
    """TEI's ``/info`` of the version a request would reach now: what it is and the
    limits a request meets."""
    spec, task = runtime.spec, runtime.task
    route = task.tei_route or ""
    kind = MODEL_TYPES.get(route, task.name)
    details: dict[str, Any]
    if kind == "embedding":
        details = {"pooling": POOLING.get(task.head, task.head)}
    else:
        details = {
            "id2label": {str(i): label for i, label in enumerate(spec.labels)},
            "label2id": {label: i for i, label in enumerate(spec.labels)},
        }
    return {
        "model_id": model.name,
        "model_sha": None,
        "model_dtype": spec.precision or "unknown",
        "model_type": {kind: details},
        "max_input_length": spec.max_length,
        "max_batch_tokens": limits.max_texts * spec.max_length,
        "max_client_batch_size": limits.max_texts,
        "auto_truncate": True,
        "tokenization_workers": 1,
        "version": __version__,
        # infergate's own: the version that answered, and its prompts.
        "model_version": runtime.served.version,
        "prompts": dict(spec.prompts),
        "default_prompt_name": spec.default_prompt_name,
    }
