"""What differs between the tasks infergate serves, each task in one module.

A :class:`Task` says how its graph is exported (the transformers model class and the
head the export wrapper puts on it), what the graph outputs, how texts are tokenized,
how the raw output becomes an answer, and which per-text figures its statistics are
made of: one value per text (a confidence, an embedding norm, a relevance score...) and,
for some, counts per category (predicted classes, entity types). Reference statistics,
drift, metrics and the canary counters are computed from those figures alone, so a new
task is added here, not in each of them.

Pure: numpy and the tokenizer wrapper only (no torch, Ray, Triton or MLflow).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from infergate.errors import InvalidInput
from infergate.observe.metrics import Metric

if TYPE_CHECKING:
    from infergate.serving.runtime import Prediction
    from infergate.serving.tokenization import Batch, TextTokenizer
    from infergate.versions import Spec

# Engines a task's model is registered for and Triton runs (Task.engine).
ONNX = "onnx"
CTRANSLATE2 = "ctranslate2"


@dataclass(frozen=True)
class Figures:
    """Per-text figures of one batch of outputs, what statistics are made of."""

    values: np.ndarray  # float64 [texts]: the task's value (see Task.value_key)
    categories: np.ndarray | None = None  # float64 [texts, len(names)]: counts per category
    names: tuple[str, ...] = ()  # the categories' names

    @classmethod
    def concat(cls, parts: Sequence[Figures]) -> Figures:
        values = np.concatenate([p.values for p in parts])
        categories = [p.categories for p in parts if p.categories is not None]
        if len(categories) != len(parts):
            return cls(values)
        return cls(values, np.concatenate(categories), parts[0].names)


@dataclass(frozen=True)
class Paired:
    """A canary's answers to the texts its champion answered, compared text by text (the
    shadow stage of a rollout, ``infergate.control.shadow``)."""

    agreement: np.ndarray  # float64 [texts judged], each 0 (disagrees) to 1 (agrees)
    change: float = 0.0  # the task's largest difference over the texts (see each task)


def agreeing(flags: Sequence[bool] | np.ndarray, change: float) -> Paired:
    return Paired(np.asarray(flags, dtype=np.float64), float(change))


class Comparison:
    """Compares a canary's predictions with its champion's, request by request; one per
    canary, as a measure may need the texts seen before (embeddings' neighbours)."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def __call__(self, champion: Prediction, canary: Prediction, texts: list[str]) -> Paired:
        return self.task.compare(champion, canary, texts)


class Task:
    """One served task. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    output_name: ClassVar[str]  # the graph's and Triton's output
    # transformers Auto class the export loads, and the head its graph ends with (heads).
    auto_model: ClassVar[str]
    head: ClassVar[str]
    engine: ClassVar[str] = ONNX  # registration converts the model for it; Triton runs it
    # The inputs are (query, text) pairs, told apart by token type ids.
    pairs: ClassVar[bool] = False
    per_token: ClassVar[bool] = False  # output [batch, sequence, n] rather than [batch, n]
    needs_labels: ClassVar[bool] = False  # config.id2label names the outputs
    # Request parameters (name -> type) this task takes; protocols.wire.PARAMETERS holds all.
    parameters: ClassVar[Mapping[str, type]] = {}
    probe_parameters: ClassVar[Mapping[str, Any]] = {}  # what a readiness probe sends
    value_key: ClassVar[str]  # the per-text value's name in reference and drift
    value_metric: ClassVar[Metric]  # its histogram
    value_edges: ClassVar[tuple[float, ...] | None] = None  # fixed bins; None: deciles
    category_key: ClassVar[str | None] = None  # categories' shares in the reference
    category_feature: ClassVar[str] = ""  # their drift feature
    category_metric: ClassVar[Metric | None] = None  # their counter
    centroid: ClassVar[bool] = False  # drift also follows the mean direction of ``raw``
    # Seconds of the Triton call per generated token, observed per request (translation).
    time_per_token_metric: ClassVar[Metric | None] = None
    # Registration's gates on an ONNX graph's output (infergate.registration): the parity
    # check's tolerance per precision, on the figure a client is sent, and the quality
    # budget a registration meets unless told otherwise (names of quality.FIGURES).
    parity_tolerances: ClassVar[Mapping[str, float]] = {}
    quality_budget: ClassVar[Mapping[str, float]] = {}
    # The outputs a user's multi-output graph is read from, after ``output_name``.
    graph_outputs: ClassVar[tuple[str, ...]] = ()
    # Which endpoints beside predict serve it: TEI's and Cohere's rerank, OpenAI's
    # embeddings, and the KServe V2 protocol's tensors (its output names, in order).
    reranks: ClassVar[bool] = False
    openai_embeddings: ClassVar[bool] = False
    # Text Embeddings Inference's route that serves it (``infergate.protocols.tei``):
    # "embed", "embed_sparse", "predict" or "rerank"; "entities" for token classification,
    # which TEI lacks (Hugging Face's inference API shape, at the TEI base URL's root).
    tei_route: ClassVar[str | None] = None
    # Registered with named prompts (instruction prefixes) a request picks by name.
    takes_prompts: ClassVar[bool] = False
    v2_outputs: ClassVar[tuple[str, ...]] = ()
    # The shadow stage's floor: the share of texts on which a good canary agrees with its
    # champion (a retrained version differs on some). Policy tags override it.
    shadow_agreement: ClassVar[float] = 0.9
    # ``infergate batch``: an answer that is an object becomes a column per key; any other
    # answer (a vector, a list of entities) one column of this name. A request parameter
    # that may hold one value per text, read from a column (a reranker's query).
    batch_column: ClassVar[str] = "output"
    row_parameter: ClassVar[str | None] = None

    def check_parameters(self, parameters: Mapping[str, Any], model: str) -> None:
        """Refuse parameters of other tasks, and values out of range."""
        for key in parameters:
            if key not in self.parameters:
                users = [task.name for task in TASKS.values() if key in task.parameters]
                raise InvalidInput(
                    f"parameter {key!r} applies to {' and '.join(users)} models; {model!r} "
                    f"is a {self.name} model, whose parameters are "
                    f"{sorted(self.parameters) or 'none'}",
                    param="parameters",
                )

    def output_dim_problem(self, dim: int) -> str | None:
        """Why a graph with ``dim`` outputs per text cannot serve this task, None if it
        can; registration's message goes on to say what the graph has."""
        return None

    def tokenize(
        self, tokenizer: TextTokenizer, texts: list[str], parameters: Mapping[str, Any]
    ) -> Batch:
        return tokenizer(texts)

    def inference_inputs(self, batch: Batch, parameters: Mapping[str, Any]) -> dict[str, Any]:
        """Triton inputs beside ``input_ids`` and ``attention_mask``: name -> int64
        ``[texts, n]`` array (translation's decoding settings); none for most tasks."""
        return {}

    def answer(
        self,
        raw: np.ndarray,
        batch: Batch,
        texts: list[str],
        labels: Sequence[str],
        parameters: Mapping[str, Any],
        tokenizer: TextTokenizer,
    ) -> tuple[Any, np.ndarray]:
        """``postprocess``, for tasks that need the tokenizer back (to detokenize)."""
        return self.postprocess(raw, batch, texts, labels, parameters)

    def postprocess(
        self,
        raw: np.ndarray,
        batch: Batch,
        texts: list[str],
        labels: Sequence[str],
        parameters: Mapping[str, Any],
    ) -> tuple[Any, np.ndarray]:
        """The answer for the client (one item per text), and the array statistics are
        taken from (``Prediction.raw``)."""
        raise NotImplementedError

    def figures(self, raw: np.ndarray, batch: Batch | None, labels: Sequence[str]) -> Figures:
        """Per-text figures of ``raw`` (what ``postprocess`` returned second)."""
        raise NotImplementedError

    def v2_output_metadata(self, spec: Spec | None) -> list[dict[str, Any]]:
        """The KServe V2 metadata of ``v2_outputs`` for a version of ``spec`` (None:
        versions that disagree, whose sizes are -1)."""
        return []

    def v2_tensors(self, outputs: Any, raw: np.ndarray) -> dict[str, tuple[str, Any]]:
        """Each of ``v2_outputs`` of one answer (``postprocess``'s two results): its V2
        datatype and values (an array, or a list of strings for BYTES)."""
        raise NotImplementedError

    def comparison(self) -> Comparison:
        """A new comparison of a canary with its champion (see ``compare``)."""
        return Comparison(self)

    def compare(self, champion: Prediction, canary: Prediction, texts: list[str]) -> Paired:
        """How far ``canary``'s answers to ``texts`` are from ``champion``'s, text by text."""
        raise NotImplementedError

    def redacted(self, text: str, answer: Any) -> str:
        """``text`` with what this task's ``answer`` to it found replaced (the payload
        log's ``texts: redact``); only a task that finds spans in texts can."""
        raise InvalidInput(f"a {self.name} model finds no spans in texts to redact")

    def counter_shares(
        self, figures: Figures, raw: np.ndarray, batch: Batch | None, labels: Sequence[str]
    ) -> tuple[np.ndarray, tuple[str, ...]]:
        """One request's output shares for the canary comparison (summing to 1, or empty
        when there is nothing to count) and the classes they are of (``()`` for bins)."""
        if figures.categories is not None:
            counts = figures.categories.sum(axis=0)
            total = counts.sum()
            return (counts / total if total else np.zeros(0)), figures.names
        bins = np.searchsorted(self.value_metric.buckets, figures.values)
        counts = np.bincount(bins, minlength=len(self.value_metric.buckets) + 1)
        return counts / max(len(figures.values), 1), ()


def get(name: str) -> Task:
    """The task called ``name``; ValueError for another."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"task {name!r} is not supported; use one of {list(TASKS)}") from None


def of(prediction: Any) -> Task:
    """The task of a ``runtime.Prediction``; one made by hand without its task's name is
    a classifier's if it has labels, else an embedding model's (the original two)."""
    if prediction.task:
        return get(prediction.task)
    return get("text-classification" if prediction.labels else "feature-extraction")


def _registry() -> dict[str, Task]:
    from infergate.tasks.classification import TextClassification
    from infergate.tasks.embedding import FeatureExtraction
    from infergate.tasks.ranking import TextRanking
    from infergate.tasks.sparse import SparseEmbedding
    from infergate.tasks.tokens import TokenClassification
    from infergate.tasks.translation import Translation

    tasks: list[Task] = [
        FeatureExtraction(),
        TextClassification(),
        TextRanking(),
        SparseEmbedding(),
        TokenClassification(),
        Translation(),
    ]
    return {task.name: task for task in tasks}


TASKS: dict[str, Task] = _registry()
