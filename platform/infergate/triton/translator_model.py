"""Triton Python-backend model: CTranslate2 over one dynamic batch of ragged requests.

Copied into a translation model's folder as ``<name>/1/model.py`` beside the converted
model (``<name>/1/ctranslate2/``: ``model.bin``, ``config.json`` and the vocabulary
files); runs inside Triton's Python-backend stub and depends on numpy and ctranslate2
only. (Triton has a CTranslate2 backend of its own only as C++ to build against a
server; the nvidia-pytriton wheel runs Python-backend models only.)

Contract: inputs ``input_ids`` and ``attention_mask`` (int64 ``[rows, sequence]``, one
request's rows right-padded by the front-end), ``decoding`` (int64 ``[rows, 2]``:
beam size and maximum decoding length of each row, the length capped to the config's
``max_decoding_length``, past which the decoder has no positions); output
``translation_ids`` (int64 ``[rows, longest]``): the generated token ids, end token left
out, each row padded with -1 to the longest of its request. Rows of every request in the
batch are grouped by their decoding settings and each group is one ``translate_batch``
call.

CTranslate2 takes tokens as strings: ids are mapped through the converted model's
vocabulary, which keeps the tokenizer's ids (``infergate.registration.ct2_export`` checks that).

``infergate batch`` imports :class:`Engine` (outside Triton, where
``triton_python_backend_utils`` is absent), so a batch job decodes exactly as served.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ctranslate2
import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ModuleNotFoundError:  # outside Triton: infergate batch uses the Engine only
    pb_utils = None

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
DECODING = "decoding"
OUTPUT = "translation_ids"
PAD_ID = -1
MODEL_DIR = "ctranslate2"
# Registered precision -> CTranslate2 compute type on a CPU and on a GPU instance.
COMPUTE_TYPES = {
    "int8": {"CPU": "int8", "GPU": "int8_float16"},
    "fp16": {"CPU": "float32", "GPU": "float16"},
    "fp32": {"CPU": "float32", "GPU": "float32"},
}


def read_vocabulary(model_dir: Path) -> list[str]:
    """The target vocabulary of a converted model: ``shared_vocabulary.json`` or
    ``target_vocabulary.json`` (a list of tokens, index = id)."""
    for name in ("shared_vocabulary.json", "target_vocabulary.json"):
        path = model_dir / name
        if path.is_file():
            return list(json.loads(path.read_text()))
    raise FileNotFoundError(f"no vocabulary file in {model_dir}")


Row = tuple[list[str], tuple[int, int]]  # one text's tokens and (beam size, max length)


class Engine:
    """A ``ctranslate2.Translator`` on rows of token ids, as the served model runs it."""

    def __init__(
        self,
        model_dir: Path,
        *,
        precision: str,
        gpu: bool = False,
        device_index: int = 0,
        threads: int = 0,
        max_decoding_length: int | None = None,
    ) -> None:
        kind = "GPU" if gpu else "CPU"
        self.max_decoding_length = max_decoding_length  # None: no cap
        self.translator = ctranslate2.Translator(
            str(model_dir),
            device="cuda" if gpu else "cpu",
            device_index=device_index,
            compute_type=COMPUTE_TYPES.get(precision, COMPUTE_TYPES["int8"])[kind],
            inter_threads=1,  # Triton's instances (or batch's actors) are the parallel ones
            intra_threads=threads,  # 0: CTranslate2 picks
        )
        # Source and target share one vocabulary for the models registered so far; with
        # two files the source one maps input ids.
        source = model_dir / "source_vocabulary.json"
        self.tokens = read_vocabulary(model_dir)
        self.source_tokens: list[str] = (
            json.loads(source.read_text()) if source.is_file() else None
        ) or self.tokens
        self.ids = {token: i for i, token in enumerate(self.tokens)}

    def rows(self, ids: np.ndarray, mask: np.ndarray, decoding: np.ndarray) -> list[Row]:
        """Each row's tokens and decoding settings; ValueError for inputs that cannot run."""
        if ids.shape != mask.shape or ids.ndim != 2 or decoding.shape != (ids.shape[0], 2):
            raise ValueError(
                f"shapes {list(ids.shape)}, {list(mask.shape)} and {list(decoding.shape)}: "
                f"expected [rows, sequence] twice and [rows, 2]"
            )
        vocabulary = len(self.source_tokens)
        rows = []
        for row_ids, row_mask, (beam, length) in zip(ids, mask, decoding, strict=True):
            kept = row_ids[row_mask.astype(bool)]
            if kept.size and (kept.min() < 0 or kept.max() >= vocabulary):
                raise ValueError(f"token ids must be within 0..{vocabulary - 1}")
            if beam < 1 or length < 1:
                raise ValueError("beam size and maximum decoding length must be at least 1")
            tokens = [self.source_tokens[i] for i in kept.tolist()]
            if self.max_decoding_length is not None:
                length = min(int(length), self.max_decoding_length)
            rows.append((tokens, (int(beam), int(length))))
        return rows

    def translate(self, rows: list[Row]) -> tuple[list[list[int]], dict[int, str]]:
        """The generated ids of every row, rows grouped by their settings into one
        ``translate_batch`` call each; and the rows whose group failed, with why."""
        groups: dict[tuple[int, int], list[int]] = {}
        for position, (_, key) in enumerate(rows):
            groups.setdefault(key, []).append(position)
        outputs: list[list[int]] = [[] for _ in rows]
        failed: dict[int, str] = {}
        for (beam, length), positions in groups.items():
            try:
                results = self.translator.translate_batch(
                    [rows[p][0] for p in positions],
                    beam_size=beam,
                    max_decoding_length=length,
                )
            except Exception as exc:  # bad settings or ids: the rows of the group fail
                for p in positions:
                    failed[p] = f"CTranslate2 failed on this request: {exc}"
                continue
            for p, result in zip(positions, results, strict=True):
                outputs[p] = [self.ids.get(token, 0) for token in result.hypotheses[0]]
        return outputs, failed


def padded(generated: list[list[int]]) -> np.ndarray:
    """``[rows, longest]`` int64 of the rows' ids, each padded with ``PAD_ID``."""
    longest = max((len(ids) for ids in generated), default=0)
    array = np.full((len(generated), max(longest, 1)), PAD_ID, dtype=np.int64)
    for row, ids in enumerate(generated):
        array[row, : len(ids)] = ids
    return array


class TritonPythonModel:
    """One model instance: an :class:`Engine`."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        threads = int(parameters.get("intra_threads", {}).get("string_value", "0"))
        precision = parameters.get("precision", {}).get("string_value", "int8")
        limit = parameters.get("max_decoding_length", {}).get("string_value", "0")
        self.engine = Engine(
            Path(args["model_repository"]) / args["model_version"] / MODEL_DIR,
            precision=precision,
            gpu=args.get("model_instance_kind") == "GPU",
            device_index=int(args.get("model_instance_device_id", "0")),
            threads=threads,
            max_decoding_length=int(limit) or None,
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        """Translate every row of every request, grouped by decoding settings; one
        response per request. A malformed request gets its own error response."""
        responses: list[Any] = [None] * len(requests)
        rows: list[Row] = []
        owners: list[int] = []  # each row's request
        for index, request in enumerate(requests):
            try:
                mine = self._rows(request)
            except ValueError as problem:
                responses[index] = _error_response(str(problem))
                continue
            rows.extend(mine)
            owners.extend([index] * len(mine))
        outputs, failed_rows = self.engine.translate(rows)
        failed = {owners[p]: message for p, message in failed_rows.items()}
        per_request: dict[int, list[list[int]]] = {}
        for position, index in enumerate(owners):
            per_request.setdefault(index, []).append(outputs[position])
        for index, generated in per_request.items():
            if index in failed:
                responses[index] = _error_response(failed[index])
                continue
            tensor = pb_utils.Tensor(OUTPUT, padded(generated))
            responses[index] = pb_utils.InferenceResponse(output_tensors=[tensor])
        return responses

    def _rows(self, request: Any) -> list[Row]:
        ids = pb_utils.get_input_tensor_by_name(request, INPUT_IDS)
        mask = pb_utils.get_input_tensor_by_name(request, ATTENTION_MASK)
        decoding = pb_utils.get_input_tensor_by_name(request, DECODING)
        if ids is None or mask is None or decoding is None:
            raise ValueError(f"the request needs {INPUT_IDS}, {ATTENTION_MASK} and {DECODING}")
        return self.engine.rows(ids.as_numpy(), mask.as_numpy(), decoding.as_numpy())

    def finalize(self) -> None:
        vars(self).pop("engine", None)  # the translator's memory goes with its last reference


def _error_response(message: str) -> Any:
    error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)
