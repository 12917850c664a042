"""Which served versions are loaded in Triton: the budget and its eviction policy (pure).

A registry may serve more versions than a Triton can hold. With a budget
(``triton.max_loaded_versions``) only the versions asked for lately stay loaded: the
control plane loads a cold one on demand after making room, unloading the least recently
used versions first, and unloads a version nobody asked for within
``triton.idle_unload_s``. Two kinds of version are never chosen: one with requests in
flight (its answers would fail), and a protected one: a canary under analysis and its
champion, whose comparison must not be skewed by cold starts.

With several Tritons (a fleet), the budget holds per Triton: ``Placement`` keeps a
``Residency`` for each, a version is loaded on one of them when asked for (one with room,
else the one whose version to go has been unused longest), and replicas send its
requests to the Tritons that hold it. Without a budget (no limit, or idle unloads alone)
every Triton holds every loaded version.

Nothing here talks to Triton; ``ControlPlane`` (``infergate.control.reconcile``) does
the loads and unloads this decides, and tells it what happened. The clock is injected.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from infergate.errors import BackendUnavailable
from infergate.versions import CANARY, ServedVersion


class NoRoom(BackendUnavailable):
    """Every loaded version is in use or protected: nothing can be unloaded for another."""


@dataclass
class Residency:
    """The loaded versions (Triton model names) and when each was last used.

    ``budget``: most versions loaded at once, None for no limit; ``idle_unload_s``: a
    version unused this long is unloaded, None for never."""

    budget: int | None = None
    idle_unload_s: float | None = None
    clock: Callable[[], float] = time.monotonic
    loaded: set[str] = field(default_factory=set)
    last_used: dict[str, float] = field(default_factory=dict)

    @property
    def managed(self) -> bool:
        """Whether versions may be out of Triton while served (a budget or idle unloads)."""
        return self.budget is not None or self.idle_unload_s is not None

    def used(self, models: Iterable[str]) -> None:
        """``models`` were asked for now."""
        now = self.clock()
        for model in models:
            self.last_used[model] = now

    def seen(self, ages: dict[str, float]) -> None:
        """``ages``: seconds since each model was last used, as the replicas report."""
        now = self.clock()
        for model, age in ages.items():
            used = now - age
            if used > self.last_used.get(model, float("-inf")):
                self.last_used[model] = used

    def did_load(self, model: str) -> None:
        self.loaded.add(model)
        self.last_used[model] = self.clock()  # new: not the first to go

    def did_unload(self, model: str) -> None:
        self.loaded.discard(model)

    def forget(self, model: str) -> None:
        """``model`` is served no more."""
        self.loaded.discard(model)
        self.last_used.pop(model, None)

    def make_room(self, model: str, *, busy: set[str], protected: set[str]) -> list[str]:
        """The versions to unload, least recently used first, so that ``model`` fits in
        the budget; none if it is loaded already or there is no budget.

        Raises:
            NoRoom: the versions that would have to go are all busy or protected.
        """
        if self.budget is None or model in self.loaded:
            return []
        excess = len(self.loaded) + 1 - self.budget
        if excess <= 0:
            return []
        candidates = sorted(
            (m for m in self.loaded if m not in busy and m not in protected),
            key=lambda m: (self.last_used.get(m, float("-inf")), m),
        )
        if len(candidates) < excess:
            raise NoRoom(
                f"{len(self.loaded)} versions are loaded (budget {self.budget}) and "
                f"{len(self.loaded) - len(candidates)} of them are in use or under a canary "
                "analysis; retry shortly, or raise triton.max_loaded_versions"
            )
        return candidates[:excess]

    def idle(self, *, busy: set[str], protected: set[str]) -> list[str]:
        """The loaded versions unused for ``idle_unload_s``, oldest first."""
        if self.idle_unload_s is None:
            return []
        limit = self.clock() - self.idle_unload_s
        idle = [
            m
            for m in self.loaded
            if m not in busy and m not in protected and self.last_used.get(m, limit) <= limit
        ]
        return sorted(idle, key=lambda m: (self.last_used.get(m, limit), m))


@dataclass
class Placement:
    """Which Triton (by ``host:port``) holds which versions: a ``Residency`` for each,
    all with the same budget; a version's last use is shared (replicas report it by
    version, wherever it ran)."""

    budget: int | None = None
    idle_unload_s: float | None = None
    clock: Callable[[], float] = time.monotonic
    tritons: dict[str, Residency] = field(default_factory=dict)

    @property
    def managed(self) -> bool:
        return self.budget is not None or self.idle_unload_s is not None

    @property
    def placed(self) -> bool:
        """Whether each Triton holds a set of its own (a budget), rather than all the same."""
        return self.budget is not None

    def of(self, triton: str) -> Residency:
        """``triton``'s residency, empty for a Triton not seen before."""
        if triton not in self.tritons:
            self.tritons[triton] = Residency(self.budget, self.idle_unload_s, self.clock)
        return self.tritons[triton]

    def keep(self, tritons: Iterable[str]) -> list[str]:
        """Only ``tritons`` resolve now: forget what the others held (a pod that went
        away); those forgotten."""
        gone = sorted(set(self.tritons) - set(tritons))
        for triton in gone:
            del self.tritons[triton]
        return gone

    def holders(self, model: str) -> list[str]:
        return sorted(t for t, r in self.tritons.items() if model in r.loaded)

    def holds(self, triton: str) -> set[str]:
        residency = self.tritons.get(triton)
        return set() if residency is None else set(residency.loaded)

    @property
    def loaded(self) -> dict[str, list[str]]:
        """Each loaded version and the Tritons that hold it."""
        holders: dict[str, list[str]] = {}
        for triton, residency in sorted(self.tritons.items()):
            for model in residency.loaded:
                holders.setdefault(model, []).append(triton)
        return dict(sorted(holders.items()))

    @property
    def fullest(self) -> int:
        """The most versions one Triton holds (at most the budget)."""
        return max((len(r.loaded) for r in list(self.tritons.values())), default=0)

    def used(self, models: Iterable[str]) -> None:
        models = list(models)
        for residency in self.tritons.values():
            residency.used(models)

    def seen(self, ages: dict[str, float]) -> None:
        for residency in self.tritons.values():
            residency.seen(ages)

    def did_load(self, model: str, tritons: Iterable[str]) -> None:
        for triton in tritons:
            self.of(triton).did_load(model)

    def did_unload(self, model: str, triton: str) -> None:
        if triton in self.tritons:  # else forgotten meanwhile: nothing to record
            self.tritons[triton].did_unload(model)

    def forget(self, model: str) -> None:
        for residency in self.tritons.values():
            residency.forget(model)

    def choose(
        self, model: str, tritons: Iterable[str], *, busy: set[str], protected: set[str]
    ) -> tuple[str, list[str]]:
        """Where to load ``model``, and what to unload there first: a Triton with room
        (the emptiest), else the one whose versions to go were used least recently.

        Raises:
            NoRoom: on every Triton, the versions that would have to go are busy or
                protected (or there is no Triton).
        """
        with_room: list[tuple[int, str]] = []  # (versions it holds, triton)
        to_free: list[tuple[int, float, str, list[str]]] = []  # (count, last use, ...)
        refused: NoRoom | None = None
        for triton in sorted(tritons):
            residency = self.of(triton)
            try:
                victims = residency.make_room(model, busy=busy, protected=protected)
            except NoRoom as exc:
                refused = exc
                continue
            if not victims:
                with_room.append((len(residency.loaded), triton))
            else:  # the fewest to unload, then those whose latest use is oldest
                latest = max(residency.last_used.get(v, float("-inf")) for v in victims)
                to_free.append((len(victims), latest, triton, victims))
        if with_room:
            return min(with_room)[1], []
        if to_free:
            _count, _latest, triton, victims = min(to_free)
            return triton, victims
        raise refused or NoRoom("no Triton answers to load it into")

    def idle(self, *, busy: set[str], protected: set[str]) -> list[tuple[str, str]]:
        """``(triton, model)`` for each version unused for ``idle_unload_s`` there."""
        return [
            (triton, model)
            for triton, residency in sorted(self.tritons.items())
            for model in residency.idle(busy=busy, protected=protected)
        ]


def protected(served: Iterable[ServedVersion]) -> set[str]:
    """The Triton models of every model with a canary: the canary and its champion."""
    served = list(served)
    under_analysis = {v.name for v in served if v.role == CANARY}
    return {v.triton_model for v in served if v.name in under_analysis}
