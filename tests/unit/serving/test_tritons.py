"""A replica's calls go to the Tritons that hold each version, in turn, and to the
configured address for a version nobody placed; the ``Warmer`` learns where a version it
asked for was loaded. Triton is faked (``FakeTritonBackend``)."""

import asyncio

import numpy as np

from fakes import FakeTritonBackend
from infergate.serving.tritons import Tritons
from infergate.serving.warming import Warmer

IDS = np.ones((1, 3), dtype=np.int64)


def test_calls_go_to_the_holders_in_turn_and_unplaced_ones_to_the_configured_address():
    opened: dict[str, FakeTritonBackend] = {}

    def connect(url: str, timeout_s: float) -> FakeTritonBackend:
        opened[url] = FakeTritonBackend(url, timeout_s, outputs=lambda *args: np.zeros((1, 2)))
        return opened[url]

    placement = {"a__v1": ["10.0.0.5:8001", "10.0.0.6:8001"], "b__v1": ["10.0.0.6:8001"]}
    tritons = Tritons(connect("svc:8001", 5.0), connect, lambda m: placement.get(m, ()))

    async def scenario() -> None:
        for model in ["a__v1", "a__v1", "a__v1", "b__v1", "c__v1"]:
            await tritons.infer(model, IDS, IDS, "logits")
        await tritons.close()

    asyncio.run(scenario())
    calls = {url: backend.calls for url, backend in opened.items()}
    assert calls == {
        "svc:8001": ["c__v1"],
        "10.0.0.5:8001": ["a__v1", "a__v1"],
        "10.0.0.6:8001": ["a__v1", "b__v1"],
    }
    assert all(backend.closed for backend in opened.values())
    assert opened["10.0.0.5:8001"].timeout_s == 5.0


def test_the_warmer_learns_where_a_version_was_loaded_and_from_each_placement():
    async def warm(model: str, timeout_s: float) -> tuple[str | None, list[str]]:
        return None, ["10.0.0.6:8001"]

    async def scenario() -> Warmer:
        warmer = Warmer(warm, timeout_s=5)
        warmer.set_resident(1, {"a__v1": ["10.0.0.5:8001"]})
        await warmer.load("b__v1")
        return warmer

    warmer = asyncio.run(scenario())
    assert warmer.holders == {"a__v1": ("10.0.0.5:8001",), "b__v1": ("10.0.0.6:8001",)}
    assert warmer.is_loaded("b__v1")
    warmer.set_resident(2, {"b__v1": ["10.0.0.5:8001"]})  # a unloaded, b moved
    assert warmer.holders == {"b__v1": ("10.0.0.5:8001",)} and not warmer.is_loaded("a__v1")
