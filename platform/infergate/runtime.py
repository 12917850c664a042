"""One served model version inside a front-end replica: tokenize, infer, post-process.

Pure: the version arrives loaded (``infergate.replica`` reads its files from the
registry), and inference goes through whatever ``Backend`` the replica hands in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from infergate.batching import Backend
from infergate.errors import InvalidInput
from infergate.metrics import INFERENCE, POSTPROCESS, TOKENIZE, Stage
from infergate.postprocess import classification_outputs, l2_normalize, softmax
from infergate.tokenization import Batch, TextTokenizer
from infergate.versions import ServedVersion, Spec


@dataclass
class Timings:
    """Seconds per stage of one prediction."""

    tokenize_s: float = 0.0
    inference_s: float = 0.0
    postprocess_s: float = 0.0

    def stages(self) -> Iterator[tuple[Stage, float]]:
        """``(stage, seconds)``, the stages that name the metrics' labels and headers."""
        yield TOKENIZE, self.tokenize_s
        yield INFERENCE, self.inference_s
        yield POSTPROCESS, self.postprocess_s


@dataclass(frozen=True)
class Prediction:
    outputs: Any  # list of dicts (classification) or a 2-D array (embeddings)
    batch: Batch
    raw: np.ndarray  # probabilities or raw embeddings, for statistics
    timings: Timings
    labels: list[str]  # class names (text-classification), [] for embeddings


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
        self.reference = reference or {}  # the registration's statistics, for drift
        self.in_flight = 0  # requests inside predict: a version leaving waits for them

    def with_served(self, served: ServedVersion) -> ModelRuntime:
        """The same loaded version under a new role or weight."""
        return ModelRuntime(served, self.spec, self.tokenizer, self.reference)

    async def predict(
        self, texts: list[str], parameters: dict[str, Any], backend: Backend
    ) -> Prediction:
        if "normalize" in parameters and self.spec.task != "feature-extraction":
            raise InvalidInput(
                f"parameter 'normalize' applies to embedding models; {self.served.name!r} "
                f"is a {self.spec.task} model"
            )
        start = time.perf_counter()
        batch = self.tokenizer(texts)
        tokenized = time.perf_counter()
        self.in_flight += 1
        try:
            raw = await backend.infer(
                self.triton_model, batch.input_ids, batch.attention_mask, self.spec.output_name
            )
        finally:
            self.in_flight -= 1
        inferred = time.perf_counter()
        if self.spec.task == "text-classification":
            raw = softmax(raw)
            outputs: Any = classification_outputs(raw, self.spec.labels)
        else:
            outputs = l2_normalize(raw) if parameters.get("normalize", True) else raw
        done = time.perf_counter()
        timings = Timings(tokenized - start, inferred - tokenized, done - inferred)
        return Prediction(outputs, batch, raw, timings, self.spec.labels)


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
