"""Shadow traffic in a replica: the champion's requests mirrored to a canary in shadow,
after the answer, bounded, and compared text by text. A real inference path and
tokenizer; Triton is a fake whose answers each test chooses."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from fakes import FakeTritonBackend
from infergate.serving.inference import InferencePath
from infergate.serving.tokenization import TextTokenizer
from shadow_pair import LABELS, ask, minilm_tokenizer, positive, sentiment, settled, shadow_of


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return minilm_tokenizer()


def test_an_identical_canary_agrees_and_answers_no_client(tokenizer):
    async def run() -> None:
        model = sentiment(tokenizer)
        path = InferencePath(FakeTritonBackend(outputs=positive), {"s": model})
        answered = [await ask(path, model, ["good", "fine", "ok"]) for _ in range(5)]
        await settled(path.mirror)
        assert answered == ["1"] * 5  # every client answer is the champion's
        shadow = shadow_of(path)
        assert (shadow.requests, shadow.texts, shadow.disagreement) == (5, 15, 0.0)
        assert shadow.agreement == 1.0 and shadow.largest_change == pytest.approx(0.0)
        assert path.monitors.counters["s/2"].requests == 0  # no request of its own

    asyncio.run(run())


def test_swapped_labels_disagree_on_every_text(tokenizer):
    async def run() -> None:
        model = sentiment(tokenizer, labels=LABELS[::-1])
        path = InferencePath(FakeTritonBackend(outputs=positive), {"s": model})
        await ask(path, model, ["good", "fine"])
        await settled(path.mirror)
        shadow = shadow_of(path)
        assert (shadow.texts, shadow.disagreement) == (2, 2.0)
        # Matched by name, the probability of "positive" went from 0.95 to 0.05.
        assert shadow.largest_change == pytest.approx(0.905, abs=1e-3)

    asyncio.run(run())


def test_the_client_does_not_wait_for_the_mirror_and_too_many_are_dropped(tokenizer):
    async def run() -> None:
        release = asyncio.Event()
        backend = FakeTritonBackend(outputs=positive)
        plain = backend.infer

        async def infer(model: str, *args, **kw) -> np.ndarray:
            if model.endswith("2"):
                await release.wait()
            return await plain(model, *args, **kw)

        backend.infer = infer  # type: ignore[method-assign]
        model = sentiment(tokenizer)
        path = InferencePath(backend, {"s": model}, mirror=None)
        path.mirror.limit = 3
        for _ in range(5):  # each answered while the canary's copies hang
            assert await asyncio.wait_for(ask(path, model, ["good"]), 1) == "1"
        await asyncio.sleep(0.01)
        assert path.mirror.under_way == 3 and shadow_of(path).dropped == 2
        release.set()
        await settled(path.mirror)
        assert shadow_of(path).requests == 3

    asyncio.run(run())


def test_pinned_requests_and_a_zero_share_are_not_mirrored(tokenizer):
    async def run() -> None:
        model = sentiment(tokenizer, share=0.0)
        path = InferencePath(FakeTritonBackend(outputs=positive), {"s": model})
        await ask(path, model, ["good"])
        mirrored = sentiment(tokenizer)
        path = InferencePath(FakeTritonBackend(outputs=positive), {"s": mirrored})
        assert await ask(path, mirrored, ["good"], pinned="2") == "2"  # asked for by name
        await ask(path, mirrored, ["good"], pinned="1")
        await settled(path.mirror)
        assert shadow_of(path).requests == 0

    asyncio.run(run())


def test_a_canary_that_fails_counts_its_texts_as_disagreeing(tokenizer):
    async def run() -> None:
        def only_champion(model: str, *args) -> np.ndarray:
            if model.endswith("2"):
                raise RuntimeError("the canary's graph fails on these inputs")
            return positive(model, *args)

        model = sentiment(tokenizer)
        path = InferencePath(FakeTritonBackend(outputs=only_champion), {"s": model})
        assert await ask(path, model, ["a", "b", "c"]) == "1"
        await settled(path.mirror)
        shadow = shadow_of(path)
        assert (shadow.requests, shadow.errors, shadow.texts, shadow.disagreement) == (1, 1, 3, 3)

    asyncio.run(run())
