"""Redacting the payload log's texts with a served model's champion, from the log's
thread, on the replica's event loop."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from infergate import tasks
from infergate.errors import BackendUnavailable
from infergate.serving.redaction import Redactor


class Tagger:
    """A token classifier's runtime that tags each "Alice" as PER, and counts its calls."""

    task = tasks.get("token-classification")

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.threads: set[int] = set()

    async def predict(self, texts: list[str], parameters: dict, backend: Any) -> Any:
        self.calls.append(texts)
        self.threads.add(threading.get_ident())
        outputs = [
            [{"entity": "PER", "start": t.find("Alice"), "end": t.find("Alice") + 5}]
            if "Alice" in t else []
            for t in texts
        ]  # fmt: skip
        return SimpleNamespace(outputs=outputs)


def test_texts_go_in_chunks_to_the_champion_on_the_loop_and_come_back_redacted():
    tagger, loop = Tagger(), asyncio.new_event_loop()
    running = threading.Thread(target=loop.run_forever, daemon=True)
    running.start()
    try:
        redactor = Redactor("ner", lambda name: tagger if name == "ner" else None,
                            lambda: object(), loop, chunk=2)  # fmt: skip
        texts = ["Alice wrote", "nothing here", "to Alice", "x"]
        assert redactor(texts) == ["[PER] wrote", "nothing here", "to [PER]", "x"]
        assert tagger.calls == [texts[:2], texts[2:]]
        assert tagger.threads == {running.ident}  # the loop's thread, not the caller's
    finally:
        loop.call_soon_threadsafe(loop.stop)
        running.join(5)
        loop.close()


def test_a_model_that_is_not_served_is_an_error_not_a_text():
    loop = asyncio.new_event_loop()
    try:
        redactor = Redactor("ner", lambda name: None, lambda: object(), loop, chunk=8)
        with pytest.raises(BackendUnavailable, match="'ner' is not served here"):
            loop.run_until_complete(redactor.redacted(["Alice"]))
    finally:
        loop.close()
