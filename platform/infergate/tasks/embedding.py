"""feature-extraction: the attention-masked mean of the last hidden state (pooled in the
graph), L2-normalised by the front-end unless the request asks for the raw vector."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from infergate.observe import metrics as m
from infergate.serving.postprocess import l2_normalize
from infergate.serving.tokenization import Batch
from infergate.tasks import Figures, Task


class FeatureExtraction(Task):
    name = "feature-extraction"
    output_name = "embeddings"
    auto_model = "AutoModel"
    head = "mean_pool"
    parameters: ClassVar[Mapping[str, type]] = {"normalize": bool}
    value_key = "embedding_norm"  # of the raw vector; drift also follows its centroid
    value_metric = m.EMBEDDING_NORM
    centroid = True

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
