"""feature-extraction: the attention-masked mean of the last hidden state (pooled in the
graph), L2-normalised by the front-end unless the request asks for the raw vector."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from infergate.observe import metrics as m
from infergate.serving.postprocess import l2_normalize
from infergate.serving.tokenization import Batch
from infergate.tasks import Comparison, Figures, Paired, Task, agreeing, heads
from infergate.tasks.sparse import row_cosines

if TYPE_CHECKING:
    from infergate.serving.runtime import Prediction

if TYPE_CHECKING:
    from infergate.versions import Spec


class FeatureExtraction(Task):
    name = "feature-extraction"
    output_name = "embeddings"
    auto_model = "AutoModel"
    head = heads.MEAN_POOL
    batch_column = "embedding"
    # Gated on the cosine of the vectors, what retrieval compares.
    parity_tolerances: ClassVar[Mapping[str, float]] = {"fp32": 1e-3, "fp16": 1e-4, "int8": 0.1}
    # Retrieval notices a changed neighbour; dynamic int8 on all-MiniLM-L6-v2 kept only 0.90
    # of nearest neighbours (infergate.registration.quantise has the figures).
    quality_budget: ClassVar[Mapping[str, float]] = {"cosine_mean": 0.998, "nn_agreement": 0.97}
    graph_outputs = ("sentence_embedding", "last_hidden_state", "token_embeddings")
    parameters: ClassVar[Mapping[str, type]] = {"normalize": bool}
    value_key = "embedding_norm"  # of the raw vector; drift also follows its centroid
    value_metric = m.EMBEDDING_NORM
    centroid = True
    openai_embeddings = True
    tei_route = "embed"
    takes_prompts = True
    v2_outputs = ("embedding",)
    shadow_agreement = 0.8  # of texts keeping their nearest neighbour (Neighbours)

    def postprocess(
        self,
        raw: np.ndarray,
        batch: Batch,
        texts: list[str],
        labels: Sequence[str],
        parameters: Mapping[str, Any],
    ) -> tuple[Any, np.ndarray]:
        return (l2_normalize(raw) if parameters.get("normalize", True) else raw), raw

    def figures(self, raw: np.ndarray, batch: Batch | None, labels: Sequence[str]) -> Figures:
        return Figures(np.linalg.norm(raw, axis=-1).astype(np.float64))

    def v2_output_metadata(self, spec: Spec | None) -> list[dict[str, Any]]:
        dim = -1 if spec is None else spec.output_dim
        return [{"name": "embedding", "datatype": "FP32", "shape": [-1, dim]}]

    def v2_tensors(self, outputs: Any, raw: np.ndarray) -> dict[str, tuple[str, Any]]:
        """The embeddings as served: unit length unless the request said otherwise."""
        return {"embedding": ("FP32", np.asarray(outputs, dtype=np.float32))}

    def comparison(self) -> Comparison:
        return Neighbours(self)


class Neighbours(Comparison):
    """Embeddings compared without assuming the two versions share a space: a text agrees
    when its nearest neighbour among the last ``WINDOW`` distinct texts mirrored is the
    same text for both versions. The first texts only fill the window. The change, when
    the vectors have one size (the same model at another precision, say), is one minus
    the lowest cosine of a text's two vectors; 1 when they cannot be compared."""

    WINDOW = 64
    MIN_NEIGHBOURS = 4

    def __init__(self, task: Task) -> None:
        super().__init__(task)
        self.texts: list[str] = []
        self.ours: list[np.ndarray] = []
        self.theirs: list[np.ndarray] = []

    def __call__(self, champion: Prediction, canary: Prediction, texts: list[str]) -> Paired:
        ours, theirs = l2_normalize(champion.raw), l2_normalize(canary.raw)
        change = 1.0
        if ours.shape == theirs.shape:
            change = 1.0 - float(row_cosines(ours, theirs).min(initial=1.0))
        kept = []
        for text, a, b in zip(texts, ours, theirs, strict=True):
            if text in self.texts:
                continue
            if len(self.texts) >= self.MIN_NEIGHBOURS:
                kept.append(
                    np.argmax(np.stack(self.ours) @ a) == np.argmax(np.stack(self.theirs) @ b)
                )
            self.texts.append(text)
            self.ours.append(a)
            self.theirs.append(b)
            del self.texts[: -self.WINDOW], self.ours[: -self.WINDOW], self.theirs[: -self.WINDOW]
        return agreeing(kept, change)
