"""One served model version inside a front-end replica: tokenize, infer, post-process.

Pure: the version arrives loaded (``infergate.serving.replica`` reads its files from the
registry), and inference goes through whatever ``Backend`` the replica hands in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from infergate import tasks
from infergate.observe.metrics import INFERENCE, POSTPROCESS, TOKENIZE, Stage
from infergate.serving.batching import Backend
from infergate.serving.prompts import prompt_for, prompted, split_prompt
from infergate.serving.tokenization import Batch, TextTokenizer, split_direction
from infergate.tasks import Figures
from infergate.versions import ServedVersion, Spec


@dataclass
class Timings:
    """Seconds per stage of one prediction."""

    tokenize_s: float = 0.0
    inference_s: float = 0.0
    postprocess_s: float = 0.0

    def total_s(self) -> float:
        return self.tokenize_s + self.inference_s + self.postprocess_s

    def stages(self) -> Iterator[tuple[Stage, float]]:
        """``(stage, seconds)``, the stages that name the metrics' labels and headers."""
        yield TOKENIZE, self.tokenize_s
        yield INFERENCE, self.inference_s
        yield POSTPROCESS, self.postprocess_s


@dataclass(frozen=True)
class Prediction:
    outputs: Any  # one answer per text: the task's (infergate.tasks)
    batch: Batch
    raw: np.ndarray  # what statistics are taken from: probabilities, raw embeddings...
    timings: Timings
    labels: list[str]  # the model's labels (classes, token labels), [] for others
    figures: Figures | None = None  # per-text figures of ``raw``, for metrics and drift
    task: str = ""  # the task's name; "" (hand-made in tests): told by ``labels``
    cold_start_s: float = 0.0  # waited for the version to be loaded into Triton first


class ModelRuntime:
    """Everything a replica needs to answer for one version."""

    def __init__(
        self,
        served: ServedVersion,
        spec: Spec,
        tokenizer: TextTokenizer,
        reference: dict[str, Any] | None = None,
    ) -> None:
        self.served = served
        self.spec = spec
        self.tokenizer = tokenizer
        self.triton_model = served.triton_model
        self.task = tasks.get(spec.task)
        self.reference = reference or {}  # the registration's statistics, for drift
        self.in_flight = 0  # requests inside predict: a version leaving waits for them

    def with_served(self, served: ServedVersion) -> ModelRuntime:
        """The same loaded version under a new role or weight."""
        return ModelRuntime(served, self.spec, self.tokenizer, self.reference)

    async def predict(
        self, texts: list[str], parameters: dict[str, Any], backend: Backend
    ) -> Prediction:
        task = self.task
        prompt_name, parameters = split_prompt(parameters)
        direction, parameters = split_direction(parameters)
        task.check_parameters(parameters, self.served.name)
        tokenizer = self.tokenizer.cutting(direction)
        # The texts as the model sees them (character offsets in an answer index these).
        seen = prompted(texts, prompt_for(self.spec, prompt_name, self.served.name))
        start = time.perf_counter()
        batch = task.tokenize(tokenizer, seen, parameters)
        tokenized = time.perf_counter()
        extra = task.inference_inputs(batch, parameters)
        self.in_flight += 1
        try:
            if extra:
                raw = await backend.infer(
                    self.triton_model, batch.input_ids, batch.attention_mask,
                    self.spec.output_name, extra=extra,
                )  # fmt: skip
            else:  # every backend takes these four arguments
                raw = await backend.infer(
                    self.triton_model, batch.input_ids, batch.attention_mask, self.spec.output_name
                )
        finally:
            self.in_flight -= 1
        inferred = time.perf_counter()
        labels = self.spec.labels
        outputs, raw = task.answer(raw, batch, seen, labels, parameters, tokenizer)
        figures = task.figures(raw, batch, labels)
        done = time.perf_counter()
        timings = Timings(tokenized - start, inferred - tokenized, done - inferred)
        return Prediction(outputs, batch, raw, timings, labels, figures, task.name)


class Counted(Protocol):
    in_flight: int  # requests under way


async def drain(runtimes: list[Counted], timeout_s: float, poll_s: float = 0.01) -> bool:
    """Wait until no request of ``runtimes`` (versions, or a whole front-end) is under
    way; False if ``timeout_s`` ran out first."""
    deadline = time.monotonic() + timeout_s
    while any(runtime.in_flight for runtime in runtimes):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(poll_s)
    return True
