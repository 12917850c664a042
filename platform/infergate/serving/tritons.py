"""Which Triton a replica sends a version's calls to.

Without a budget of loaded versions every Triton holds every served version, and calls
go to the configured address (``frontend.triton_grpc_url``: this machine's Triton, or a
Service in front of the pods). With a budget, each Triton of a fleet holds a set of its
own, so a version is loaded on one Triton and not on another: the control plane says
which Tritons hold each version (``Warmer.holders``), and ``Tritons`` sends each call to
one of them, in turn, over a channel per Triton opened on first use. A version nobody
said anything about goes to the configured address; if that Triton does not have it,
the call fails as a cold one and the ``Warmer`` asks for it, learning where it landed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from infergate.serving.batching import Backend


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
        return await channel.infer(model, input_ids, attention_mask, output_name, extra=extra)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
