"""Triton Python-backend model of the ensemble baseline: text in, token ids out.

Copied by ``infergate.bench.ensemble`` into ``tokenize/1/model.py`` next to the served
``tokenizer.json``; it runs inside Triton's Python-backend stub (the only place
``triton_python_backend_utils`` exists) and needs numpy and tokenizers only. Each request
holds ``TEXT`` as ``[n, 1]`` strings and gets ``input_ids`` and ``attention_mask`` as
``[n, sequence]`` int64, padded to its longest text and truncated to ``max_length`` (a
parameter of ``config.pbtxt``), as infergate's front-end tokenizes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


class TritonPythonModel:
    """The served model's fast tokenizer."""

    def initialize(self, args: dict[str, str]) -> None:
        # On the calling thread, as infergate's replicas tokenize (tokenize_serially): a
        # fair comparison of where tokenization runs, not of thread pools.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        config = json.loads(args["model_config"])
        max_length = int(config["parameters"]["max_length"]["string_value"])
        folder = Path(args["model_repository"]) / args["model_version"]
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_length)
        pad_id = self.tokenizer.padding["pad_id"] if self.tokenizer.padding else 0
        pad_token = self.tokenizer.id_to_token(pad_id) or "[PAD]"
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)

    def execute(self, requests: list[Any]) -> list[Any]:
        """One response per request: its texts tokenized as one padded batch."""
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            decoded = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in texts]
            encodings = self.tokenizer.encode_batch(decoded)
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            tensors = [pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("attention_mask", mask)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
