"""The Ray actor the control plane and the front-end replicas meet at.

The control plane publishes the traffic table (which versions, which weights) to it;
every replica pulls the table twice a second and reports back the table it runs and its
per-version counters. That is how the control plane knows a change is live before it
unloads old versions from Triton, and what canary analysis reads. Re-deploying the
application for a table change would restart the replicas instead (Ray Serve gives every
imperative deploy a new code version) and wait out their drain period, ~35 s with the
HAProxy ingress.
"""

from __future__ import annotations

import time
from typing import Any

import ray

STATE_ACTOR = "infergate-control"
STATE_NAMESPACE = "infergate"
REPLICA_SILENT_AFTER_S = 10.0  # a replica not heard from for this long is gone


@ray.remote(num_cpus=0)
class ControlState:
    """The traffic table the control plane published, and what each replica reports."""

    def __init__(self) -> None:
        self.version = 0
        self.served: list[dict[str, Any]] = []
        self.reports: dict[str, tuple[float, int, dict[str, dict]]] = {}

    def publish(self, served: list[dict[str, Any]]) -> int:
        self.version += 1
        self.served = served
        return self.version

    def table(self, known: int) -> tuple[int, list[dict[str, Any]]] | None:
        """The table if it is newer than ``known``; None otherwise (the common case)."""
        return (self.version, self.served) if self.version > known else None

    def report(self, replica: str, table_version: int, counters: dict[str, dict]) -> int:
        """Take a replica's report; the replicas heard from lately (they share each API
        key's rate limit)."""
        now = time.monotonic()
        self.reports[replica] = (now, table_version, counters)
        return sum(now - seen < REPLICA_SILENT_AFTER_S for seen, _, _ in self.reports.values())

    def snapshot(self) -> list[dict[str, dict]]:
        return [counters for _, _, counters in self.reports.values()]

    def adopted(self, version: int) -> bool:
        """Every replica heard from lately runs ``version`` (or a newer table)."""
        now = time.monotonic()
        live = [v for seen, v, _ in self.reports.values() if now - seen < REPLICA_SILENT_AFTER_S]
        return all(v >= version for v in live)


def control_state() -> ray.actor.ActorHandle:
    """The cluster's ``ControlState``, created on first use."""
    return ControlState.options(
        name=STATE_ACTOR, namespace=STATE_NAMESPACE, lifetime="detached", get_if_exists=True
    ).remote()
