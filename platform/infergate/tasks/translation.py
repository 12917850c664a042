"""translation: a sequence-to-sequence model (Marian, T5, mT5, BART) turns each text
into another, decoded by CTranslate2 inside Triton.

The front-end tokenizes as for every task; alongside the token ids Triton receives one
``decoding`` row per text, ``(beam_size, max_decoding_length)``, so requests with other
settings still share Triton's dynamic batches (its model groups rows by their settings,
``infergate.triton.translator_model``). Triton answers the generated token ids, each row
padded with ``PAD_ID`` (-1) to the longest of its request, the end token left out; the
front-end detokenizes them into ``{"translation_text": ...}`` per text, the key of
transformers' translation pipeline.

Statistics follow the length of each translation in tokens (``output_tokens``): a model
that starts rambling or stops short shows in drift and in the canary comparison.

Pure: numpy and the tokenizer wrapper only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from infergate.errors import InvalidInput
from infergate.observe import metrics as m
from infergate.observe.chrf import chrf
from infergate.serving.tokenization import Batch, TextTokenizer
from infergate.tasks import CTRANSLATE2, Figures, Paired, Task, agreeing, heads

if TYPE_CHECKING:
    from infergate.serving.runtime import Prediction

PAD_ID = -1  # pads the output rows; no token has this id
DECODING_INPUT = "decoding"  # Triton's per-row input: (beam_size, max_decoding_length)
MAX_BEAM_SIZE = 8
MAX_DECODING_LENGTH = 512
DEFAULT_BEAM_SIZE = 1  # greedy, what the parity check at registration compares
DEFAULT_MAX_DECODING_LENGTH = 128


def output_lengths(ids: np.ndarray) -> np.ndarray:
    """Generated tokens per row of a ``PAD_ID``-padded ``[texts, longest]`` array."""
    if ids.ndim != 2:
        raise ValueError(f"translation ids have shape {ids.shape}; expected [texts, tokens]")
    return (ids != PAD_ID).sum(axis=1)


def unpad(ids: np.ndarray) -> list[list[int]]:
    """Each row's token ids without the padding (padding only ever trails)."""
    lengths = output_lengths(ids)
    return [row[:n].tolist() for row, n in zip(ids, lengths.tolist(), strict=True)]


def decoding_rows(parameters: Mapping[str, Any], texts: int) -> np.ndarray:
    """The ``decoding`` input of ``texts`` texts: ``[texts, 2]`` int64."""
    beam = int(parameters.get("beam_size", DEFAULT_BEAM_SIZE))
    length = int(parameters.get("max_decoding_length", DEFAULT_MAX_DECODING_LENGTH))
    return np.tile(np.array([beam, length], dtype=np.int64), (texts, 1))


class Translation(Task):
    name = "translation"
    output_name = "translation_ids"
    auto_model = "AutoModelForSeq2SeqLM"
    engine = CTRANSLATE2  # infergate.registration.ct2_export converts it
    head = heads.GENERATE
    parameters: ClassVar[Mapping[str, type]] = {
        "beam_size": int,
        "max_decoding_length": int,
        "source_lang": str,
        "target_lang": str,
    }
    probe_parameters: ClassVar[Mapping[str, Any]] = {"max_decoding_length": 4}
    value_key = "output_tokens"
    value_metric = m.OUTPUT_TOKENS
    time_per_token_metric = m.DECODING_TIME_PER_TOKEN
    shadow_agreement = 0.8  # of texts translated within SAME_CHRF of the champion's

    def check_parameters(self, parameters: Mapping[str, Any], model: str) -> None:
        super().check_parameters(parameters, model)
        limits = {"beam_size": MAX_BEAM_SIZE, "max_decoding_length": MAX_DECODING_LENGTH}
        for key, most in limits.items():
            value = parameters.get(key)
            if value is not None and (isinstance(value, bool) or not 1 <= value <= most):
                raise InvalidInput(
                    f"parameter {key!r} is {value!r}; use an integer from 1 to {most}",
                    param="parameters",
                )
        for key in ("source_lang", "target_lang"):
            if key in parameters:
                # The models served so far translate one language pair, fixed by their
                # weights; multilingual ones (M2M-100, NLLB) would need the language
                # tokens of their tokenizer, which registration does not record yet.
                raise InvalidInput(
                    f"parameter {key!r}: {model!r} translates one language pair, fixed by "
                    "its weights; send no language",
                    param="parameters",
                )

    def inference_inputs(self, batch: Batch, parameters: Mapping[str, Any]) -> dict[str, Any]:
        return {DECODING_INPUT: decoding_rows(parameters, len(batch.lengths))}

    def answer(
        self,
        raw: np.ndarray,
        batch: Batch,
        texts: list[str],
        labels: Sequence[str],
        parameters: Mapping[str, Any],
        tokenizer: TextTokenizer,
    ) -> tuple[Any, np.ndarray]:
        decoded = tokenizer.decode_batch(unpad(raw))
        return [{"translation_text": text} for text in decoded], raw

    def figures(self, raw: np.ndarray, batch: Batch | None, labels: Sequence[str]) -> Figures:
        return Figures(output_lengths(raw).astype(np.float64))

    def compare(self, champion: Prediction, canary: Prediction, texts: list[str]) -> Paired:
        """A text agrees when its translation has a chrF of ``SAME_CHRF`` against the
        champion's; the change is one minus the lowest chrF, over 100."""
        scores = [
            100.0 if a == b else chrf([b], [a])
            for a, b in (
                (x["translation_text"], y["translation_text"])
                for x, y in zip(champion.outputs, canary.outputs, strict=True)
            )
        ]
        return agreeing([s >= SAME_CHRF for s in scores], 1.0 - min(scores, default=100.0) / 100)


SAME_CHRF = 60.0
