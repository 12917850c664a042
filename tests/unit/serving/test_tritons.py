"""A replica's calls go to the Tritons that hold each version, in turn, and to the
configured address for a version nobody placed; the ``Warmer`` learns where a version it
asked for was loaded. Triton is faked (``FakeTritonBackend``)."""

import asyncio

import numpy as np

from fakes import FakeTritonBackend
from infergate.serving import tritons as tritons_module
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


def test_a_channel_to_a_triton_named_no_more_is_closed_once_its_calls_are_done(monkeypatch):
    monkeypatch.setattr(tritons_module, "CLOSE_POLL_S", 0.01)
    release = asyncio.Event()

    class Slow(FakeTritonBackend):
        async def infer(self, model, *args, **kwargs):  # type: ignore[no-untyped-def]
            await release.wait()
            return await super().infer(model, *args, **kwargs)

    opened: dict[str, FakeTritonBackend] = {}

    def connect(url: str, timeout_s: float) -> FakeTritonBackend:
        opened[url] = Slow(url, timeout_s, outputs=lambda *args: np.zeros((1, 2)))
        return opened[url]

    placement = {"a__v1": ["10.0.0.5:8001"], "b__v1": ["10.0.0.6:8001"]}
    tritons = Tritons(connect("svc:8001", 5.0), connect, lambda m: placement.get(m, ()))

    async def scenario() -> tuple[bool, bool]:
        release.set()
        await tritons.infer("b__v1", IDS, IDS, "logits")  # a channel to .6, idle now
        release.clear()
        out = asyncio.create_task(tritons.infer("a__v1", IDS, IDS, "logits"))
        await asyncio.sleep(0.02)
        tritons.retain(["10.0.0.6:8001"])  # .5 left the placement, with a call out
        await asyncio.sleep(0.05)
        while_out = opened["10.0.0.5:8001"].closed
        release.set()
        await out  # the call out finishes on its channel
        await asyncio.sleep(0.05)
        tritons.retain([])  # and .6 goes, at once: nothing out on it
        await asyncio.sleep(0.05)
        return while_out, opened["10.0.0.5:8001"].closed

    while_out, closed = asyncio.run(scenario())
    assert (while_out, closed) == (False, True)
    assert opened["10.0.0.6:8001"].closed and not opened["svc:8001"].closed
