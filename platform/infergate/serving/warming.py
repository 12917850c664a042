"""Cold starts as a replica sees them: a served version that is not loaded in Triton.

With a budget of loaded versions or idle unloads (``triton.max_loaded_versions``,
``triton.idle_unload_s``) the control plane loads versions when asked; ``Warmer`` is the
asking side. It knows which versions the control plane said are loaded, and in which
Triton (``resident``, ``holders``: pulled with the traffic table, and told with each load
it asked for; ``Tritons`` sends a version's calls there). It notes which versions this
replica used since its last report (``take_used``: the control plane's least recently
used order and in-flight guard come from these), and turns a request for a version that
is not loaded into one request to the control plane however many requests wait for it
here. The control plane itself loads each version once however many replicas ask
(``infergate.control.state``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from infergate.errors import ColdStartTimeout

# Asks the control plane to load a Triton model and waits at most the given seconds:
# (None, the Tritons that hold it) once it is loaded, else (why not, []) in the control
# plane's words.
Warm = Callable[[str, float], Awaitable[tuple[str | None, list[str]]]]


class Warmer:
    """One replica's side of loading on demand; ``warm`` None: every version is always
    loaded (no budget), and nothing here does anything."""

    def __init__(
        self,
        warm: Warm | None = None,
        timeout_s: float = 30.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._warm = warm
        self.timeout_s = timeout_s
        self._clock = clock
        self.resident: frozenset[str] | None = None  # None: not heard yet
        self.resident_version = 0
        # The Tritons (host:port) that hold each loaded version; a version absent goes
        # to the configured Triton address.
        self.holders: dict[str, tuple[str, ...]] = {}
        self._used: set[str] = set()
        self._asking: dict[str, asyncio.Future[None]] = {}

    @property
    def enabled(self) -> bool:
        return self._warm is not None

    def is_loaded(self, model: str) -> bool:
        """Whether Triton model ``model`` is loaded, as far as this replica knows (True
        when versions are never unloaded, or before the first word of the control plane)."""
        return not self.enabled or self.resident is None or model in self.resident

    def use(self, model: str) -> None:
        self._used.add(model)

    def take_used(self) -> list[str]:
        """The Triton models used since the last call."""
        used, self._used = self._used, set()
        return sorted(used)

    def set_resident(self, version: int, placement: dict[str, list[str]]) -> None:
        """The control plane's ``version`` of which Tritons hold which loaded version."""
        self.resident_version, self.resident = version, frozenset(placement)
        self.holders = {model: tuple(tritons) for model, tritons in placement.items()}

    async def load(self, model: str) -> float:
        """Wait until the control plane has loaded ``model``; the seconds waited.

        Raises:
            ColdStartTimeout: not loaded within ``timeout_s``, or it could not be now.
        """
        assert self._warm is not None, "load on demand is off"
        start = self._clock()
        asking = self._asking.get(model)
        if asking is None:
            asking = asyncio.ensure_future(self._ask(model))
            self._asking[model] = asking
            asking.add_done_callback(lambda done: self._forget(model, done))
        try:
            # Shielded: a request that gives up (its client left) does not cancel the
            # load the others wait for.
            await asyncio.wait_for(asyncio.shield(asking), self.timeout_s)
        except asyncio.TimeoutError:
            raise ColdStartTimeout(
                f"the model version was not loaded within {self.timeout_s:g} s "
                "(frontend.cold_start_timeout_s); it is loading, retry shortly",
                retry_after_s=2.0,
            ) from None
        if self.resident is not None:
            self.resident = self.resident | {model}
        return self._clock() - start

    async def _ask(self, model: str) -> None:
        assert self._warm is not None
        reason, holders = await self._warm(model, self.timeout_s)
        if reason is not None:
            raise ColdStartTimeout(f"the model version cannot be loaded now: {reason}")
        if holders:
            self.holders = {**self.holders, model: tuple(holders)}

    def _forget(self, model: str, done: asyncio.Future[None]) -> None:
        if self._asking.get(model) is done:
            del self._asking[model]
        if not done.cancelled():
            done.exception()  # retrieved: no "never retrieved" warning when none waited
