"""sparse-embedding: SPLADE's term weights, one vocabulary-sized sparse vector per text.

The graph takes the masked-language-model logits of every token, applies
``log(1 + relu(logit))`` and max-pools over the text's tokens (the attention mask keeps
padding out), so Triton sends one ``[vocabulary]`` row per text instead of one per token.
The front-end keeps the non-zero terms: ``{"indices": [...], "values": [...]}`` per text,
highest weight first, the ``top_k`` highest only on request.
Formal definition: Formal et al., "SPLADE v2" (https://arxiv.org/abs/2109.10086), eq. 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from infergate.errors import InvalidInput
from infergate.observe import metrics as m
from infergate.serving.tokenization import Batch
from infergate.tasks import Figures, Paired, Task, agreeing, heads

if TYPE_CHECKING:
    from infergate.serving.runtime import Prediction


def sparse_terms(weights: np.ndarray, top_k: int | None = None) -> dict[str, list]:
    """The non-zero entries of one pooled row, highest first (ties: lower index first),
    the ``top_k`` highest if given."""
    indices = np.flatnonzero(weights > 0)
    order = np.lexsort((indices, -weights[indices]))[:top_k]
    chosen = indices[order]
    return {"indices": chosen.tolist(), "values": weights[chosen].tolist()}


class SparseEmbedding(Task):
    name = "sparse-embedding"
    output_name = "term_weights"
    auto_model = "AutoModelForMaskedLM"
    head = heads.SPLADE
    # The embeddings' tolerances, gated on the cosine of the sparse vectors.
    parity_tolerances: ClassVar[Mapping[str, float]] = {"fp32": 1e-3, "fp16": 1e-4, "int8": 0.1}
    quality_budget: ClassVar[Mapping[str, float]] = {"cosine_mean": 0.99}
    graph_outputs = ("logits",)
    parameters: ClassVar[Mapping[str, type]] = {"top_k": int}
    value_key = "nonzero_terms"  # terms with a weight above 0, per text
    value_metric = m.SPARSE_TERMS
    tei_route = "embed_sparse"
    takes_prompts = True
    shadow_agreement = 0.9  # of texts whose term weights keep a cosine of MIN_COSINE

    def check_parameters(self, parameters: Mapping[str, Any], model: str) -> None:
        super().check_parameters(parameters, model)
        top_k = parameters.get("top_k")
        if top_k is not None and (isinstance(top_k, bool) or top_k < 1):
            raise InvalidInput(
                f"parameter 'top_k' must be a positive integer, got {top_k!r}",
                param="parameters",
            )

    def postprocess(
        self,
        raw: np.ndarray,
        batch: Batch,
        texts: list[str],
        labels: Sequence[str],
        parameters: Mapping[str, Any],
    ) -> tuple[Any, np.ndarray]:
        top_k = parameters.get("top_k")
        return [sparse_terms(row, top_k) for row in raw], raw

    def figures(self, raw: np.ndarray, batch: Batch | None, labels: Sequence[str]) -> Figures:
        return Figures((raw > 0).sum(axis=-1).astype(np.float64))

    def compare(self, champion: Prediction, canary: Prediction, texts: list[str]) -> Paired:
        """A text agrees when its term weights keep a cosine of ``MIN_COSINE`` with the
        champion's; the change is one minus the lowest cosine."""
        if champion.raw.shape != canary.raw.shape:  # another vocabulary: nothing in common
            return agreeing([False] * len(texts), 1.0)
        cosines = row_cosines(champion.raw, canary.raw)
        return agreeing(cosines >= MIN_COSINE, 1.0 - cosines.min(initial=1.0))


MIN_COSINE = 0.9


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cosine of each row of ``a`` with the same row of ``b`` (0 for a zero row)."""
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    dots = np.einsum("ij,ij->i", a.astype(np.float64), b.astype(np.float64))
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
