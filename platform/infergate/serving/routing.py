"""The traffic split: which served version of a model answers a request.

Pure: a replica builds one ``ServedModel`` per model from its traffic table; ``pick``
draws by weight, keeps a routing key on one version (the same on every replica), and
honours a pinned version.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infergate.errors import ModelNotFound
from infergate.serving.runtime import ModelRuntime
from infergate.versions import CANARY, ServedVersion


@dataclass(frozen=True)
class ServedModel:
    """The versions of one model a replica serves, with their traffic weights."""

    name: str
    task: str
    versions: tuple[ModelRuntime, ...]

    def pick(
        self,
        routing_key: str | None = None,
        pinned: str | None = None,
        draw: Callable[[], float] = random.random,
    ) -> ModelRuntime:
        """The version to answer: pinned if asked; else by weight, sticky per routing key."""
        if pinned is not None:
            for runtime in self.versions:
                if runtime.served.version == pinned:
                    return runtime
            served = ", ".join(v.served.version for v in self.versions)
            raise ModelNotFound(
                f"version {pinned!r} of model {self.name!r} is not served; served: {served}"
            )
        if len(self.versions) == 1:
            return self.versions[0]
        point = (
            (_bucket(routing_key) if routing_key is not None else draw() * 100.0)
            * sum(v.served.weight for v in self.versions)
            / 100.0
        )
        # Canaries take the lowest buckets: as their weight grows, a key that was on the
        # canary stays there.
        for runtime in sorted(self.versions, key=lambda v: v.served.role != CANARY):
            point -= runtime.served.weight
            if point < 0:
                return runtime
        return max(self.versions, key=lambda v: v.served.weight)  # never one at weight 0

    @property
    def shadow(self) -> ModelRuntime | None:
        """The canary in shadow, if there is one: it answers mirrored requests only."""
        return next((v for v in self.versions if v.served.shadow is not None), None)

    def describe(self, loaded: Callable[[str], bool] = lambda model: True) -> dict[str, Any]:
        """The model as ``/v1/models`` lists it; ``loaded`` tells whether a version's
        Triton model is loaded now (with load on demand, the others load when asked for)."""
        return {
            "name": self.name,
            "task": self.task,
            "versions": [_described(v.served, loaded(v.triton_model)) for v in self.versions],
        }


def _described(served: ServedVersion, loaded: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "version": served.version,
        "role": served.role,
        "weight": served.weight,
        "loaded": loaded,
    }
    if served.shadow is not None:  # answers mirrored requests only
        entry["shadow"] = served.shadow.share
    return entry


def _bucket(key: str) -> float:
    """A stable point in [0, 100) for a routing key (the same on every replica)."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 10_000 / 100.0
