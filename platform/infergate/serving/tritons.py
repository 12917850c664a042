"""Which Triton a replica sends a version's calls to.

Without a budget of loaded versions every Triton holds every served version, and calls
go to the configured address (``frontend.triton_grpc_url``: this machine's Triton, or a
Service in front of the pods). With a budget, each Triton of a fleet holds a set of its
own, so a version is loaded on one Triton and not on another: the control plane says
which Tritons hold each version (``Warmer.holders``), and ``Tritons`` sends each call to
one of them, in turn, over a channel per Triton opened on first use. A version nobody
said anything about goes to the configured address; if that Triton does not have it,
the call fails as a cold one and the ``Warmer`` asks for it, learning where it landed.
A channel to a Triton the control plane names no more (a pod that left) is closed once
its calls are done (``retain``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np

from infergate.serving.batching import Backend

CLOSE_POLL_S = 1.0  # how often a let-go channel is checked for calls still out


class TritonChannel(Backend, Protocol):
    """A Triton client for one address and deadline (``TritonBackend``)."""

    url: str
    timeout_s: float

    async def close(self) -> None: ...


class Tritons:
    """Triton channels by ``host:port``, ``default`` first; ``connect(url, timeout_s)``
    opens another, ``holders(model)`` names the Tritons that hold a Triton model."""

    def __init__(
        self,
        default: TritonChannel,
        connect: Callable[[str, float], TritonChannel],
        holders: Callable[[str], Sequence[str]],
    ) -> None:
        self.default = default
        self.url, self.timeout_s = default.url, default.timeout_s
        self._connect = connect
        self._holders = holders
        self._channels: dict[str, TritonChannel] = {default.url: default}
        self._turn = itertools.count()
        self._calls: dict[TritonChannel, int] = {}  # calls out, by channel
        self._closing: set[asyncio.Task[None]] = set()

    def channel(self, model: str) -> TritonChannel:
        """The channel for the next call of ``model``: to its holders in turn."""
        holders = self._holders(model)
        if not holders:
            return self.default
        url = holders[next(self._turn) % len(holders)]
        channel = self._channels.get(url)
        if channel is None:
            channel = self._channels[url] = self._connect(url, self.timeout_s)
        return channel

    async def infer(
        self,
        model: str,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        output_name: str,
        *,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        channel = self.channel(model)
        self._calls[channel] = self._calls.get(channel, 0) + 1
        try:
            return await channel.infer(model, input_ids, attention_mask, output_name, extra=extra)
        finally:
            self._calls[channel] -= 1

    def retain(self, urls: Iterable[str]) -> None:
        """Keep the channels to ``urls`` (and the configured one); close the others once
        their calls are done (closing cancels calls). Called on the event loop."""
        keep = {*urls, self.default.url}
        for url in [u for u in self._channels if u not in keep]:
            channel = self._channels.pop(url)
            task = asyncio.get_running_loop().create_task(self._close_when_idle(channel))
            self._closing.add(task)  # a strong reference while it waits
            task.add_done_callback(self._closing.discard)

    async def _close_when_idle(self, channel: TritonChannel) -> None:
        while self._calls.get(channel):
            await asyncio.sleep(CLOSE_POLL_S)
        self._calls.pop(channel, None)
        await channel.close()

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
