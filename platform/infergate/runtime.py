"""One served model version inside a front-end replica: tokenize, infer, post-process."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from infergate.errors import InvalidInput
from infergate.postprocess import classification_outputs, l2_normalize, softmax
from infergate.registry import REFERENCE_FILE, Registry, ServedVersion
from infergate.tokenization import Batch, TextTokenizer
from infergate.triton.repository import triton_model_name


class Backend(Protocol):
    async def infer(
        self, model: str, input_ids: np.ndarray, attention_mask: np.ndarray, output_name: str
    ) -> np.ndarray: ...


def version_cache(root: Path, served: ServedVersion) -> Path:
    """The folder under ``root`` that keeps one version's downloaded artifacts.

    Keyed by the artifact URI as well as name and version: a model deleted and registered
    again starts over at version 1 with other files, which must not be served from the
    first one's copies.
    """
    digest = hashlib.sha256(served.source.encode()).hexdigest()[:16]
    return root / triton_model_name(served.name, served.version) / digest


@dataclass(frozen=True)
class Spec:
    """The serving spec a version was registered with (``infergate.json``)."""

    task: str
    labels: list[str]
    output_name: str
    output_dim: int
    max_length: int

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Spec:
        return cls(
            task=data["task"],
            labels=list(data.get("labels", [])),
            output_name=data["output_name"],
            output_dim=int(data["output_dim"]),
            max_length=int(data["max_length"]),
        )


@dataclass
class Timings:
    """Milliseconds per stage; the names match the response headers and metrics."""

    tokenize: float = 0.0
    inference: float = 0.0
    postprocess: float = 0.0

    @property
    def total(self) -> float:
        return self.tokenize + self.inference + self.postprocess


@dataclass(frozen=True)
class Prediction:
    outputs: Any  # list of dicts (classification) or a 2-D array (embeddings)
    batch: Batch
    raw: np.ndarray  # probabilities or raw embeddings, for statistics
    timings: Timings
    labels: list[str]  # class names (text-classification), [] for embeddings


class ModelRuntime:
    """Everything a replica needs to answer for one version."""

    def __init__(self, served: ServedVersion, spec: Spec, tokenizer: TextTokenizer) -> None:
        self.served = served
        self.spec = spec
        self.tokenizer = tokenizer
        self.triton_model = triton_model_name(served.name, served.version)
        self.reference: dict[str, Any] = {}
        self.in_flight = 0  # requests inside predict: a version leaving waits for them

    @classmethod
    def load(cls, served: ServedVersion, registry: Registry, cache_dir: Path) -> ModelRuntime:
        cache = version_cache(cache_dir, served)
        spec = Spec.from_dict(registry.load_spec(served.source, cache))
        tokenizer_dir = registry.download(served.source, "tokenizer", cache)
        runtime = cls(served, spec, TextTokenizer.from_dir(tokenizer_dir, spec.max_length))
        reference = registry.download(served.source, REFERENCE_FILE, cache)
        runtime.reference = json.loads(reference.read_text())
        return runtime

    def with_served(self, served: ServedVersion) -> ModelRuntime:
        """The same loaded version under a new role or weight."""
        runtime = ModelRuntime(served, self.spec, self.tokenizer)
        runtime.reference = self.reference
        return runtime

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
        timings = Timings(
            tokenize=(tokenized - start) * 1e3,
            inference=(inferred - tokenized) * 1e3,
            postprocess=(done - inferred) * 1e3,
        )
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
