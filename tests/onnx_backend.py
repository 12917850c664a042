"""A ``Backend`` that runs a registered ONNX file in process, as Triton's model does: the
front-end's path (tokenize, infer, post-process) without Triton, for unit tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort


class OnnxBackend:
    def __init__(self, onnx_path: Path) -> None:
        self.session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        self.calls = 0

    async def infer(
        self, model: str, input_ids: np.ndarray, attention_mask: np.ndarray, output_name: str
    ) -> np.ndarray:
        self.calls += 1
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        return np.asarray(self.session.run([output_name], feeds)[0])
