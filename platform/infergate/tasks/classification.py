"""text-classification: softmax over the sequence classifier's logits, labels from the
model config."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from infergate.observe import metrics as m
from infergate.observe.reference import CONFIDENCE_EDGES
from infergate.serving.postprocess import classification_outputs, softmax
from infergate.serving.tokenization import Batch
from infergate.tasks import Figures, Paired, Task, agreeing, heads

if TYPE_CHECKING:
    from infergate.serving.runtime import Prediction
    from infergate.versions import Spec


class TextClassification(Task):
    name = "text-classification"
    output_name = "logits"
    auto_model = "AutoModelForSequenceClassification"
    head = heads.LOGITS
    parity_tolerances: ClassVar[Mapping[str, float]] = {"fp32": 1e-3, "fp16": 1e-2, "int8": 0.35}
    quality_budget: ClassVar[Mapping[str, float]] = {"label_agreement": 0.99}
    graph_outputs = ("logits",)
    needs_labels = True
    # raw_scores: the logits in place of the softmax's probabilities.
    parameters: ClassVar[Mapping[str, type]] = {"raw_scores": bool}
    value_key = "confidence"  # the probability of the predicted class
    value_metric = m.CONFIDENCE
    value_edges = CONFIDENCE_EDGES
    category_key = "class_distribution"
    category_feature = "predicted_class"
    category_metric = m.PREDICTED_CLASS
    v2_outputs = ("probabilities", "label")
    tei_route = "predict"
    shadow_agreement = 0.95  # a retrained classifier changes a few borderline labels

    def postprocess(
        self,
        raw: np.ndarray,
        batch: Batch,
        texts: list[str],
        labels: Sequence[str],
        parameters: Mapping[str, Any],
    ) -> tuple[Any, np.ndarray]:
        probabilities = softmax(raw)
        scores = raw.astype(np.float64) if parameters.get("raw_scores") else probabilities
        return classification_outputs(scores, labels), probabilities

    def figures(self, raw: np.ndarray, batch: Batch | None, labels: Sequence[str]) -> Figures:
        n_classes = raw.shape[-1]
        one_hot = np.eye(n_classes)[raw.argmax(axis=-1)]
        names = tuple(labels) if len(labels) == n_classes else ()
        return Figures(raw.max(axis=-1).astype(np.float64), one_hot, names)

    def v2_output_metadata(self, spec: Spec | None) -> list[dict[str, Any]]:
        """The probabilities' columns are in the order of their ``labels`` parameter."""
        probabilities: dict[str, Any] = {"name": "probabilities", "datatype": "FP32"}
        if spec is None:
            probabilities["shape"] = [-1, -1]
        else:
            probabilities["shape"] = [-1, len(spec.labels)]
            probabilities["parameters"] = {"labels": list(spec.labels)}
        return [probabilities, {"name": "label", "datatype": "BYTES", "shape": [-1]}]

    def v2_tensors(self, outputs: Any, raw: np.ndarray) -> dict[str, tuple[str, Any]]:
        labels = [output["label"] for output in outputs]
        return {
            "probabilities": ("FP32", np.asarray(raw, dtype=np.float32)),
            "label": ("BYTES", labels),
        }

    def compare(self, champion: Prediction, canary: Prediction, texts: list[str]) -> Paired:
        """Labels kept; the change is the largest change of a class's probability (classes
        matched by name: a retrained model may number them otherwise)."""
        kept = [
            a["label"] == b["label"] for a, b in zip(champion.outputs, canary.outputs, strict=True)
        ]
        ours, theirs = list(champion.labels), list(canary.labels)
        if sorted(ours) != sorted(theirs):
            return agreeing(kept, 1.0)
        columns = [theirs.index(label) for label in ours]
        change = np.abs(champion.raw - canary.raw[:, columns]).max(initial=0.0)
        return agreeing(kept, change)
