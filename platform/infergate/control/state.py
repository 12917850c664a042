"""The Ray actor the control plane and the front-end replicas meet at.

The control plane publishes the traffic table (which versions, which weights) to it;
every replica pulls the table twice a second and reports back the table it runs and its
per-version counters. That is how the control plane knows a change is live before it
unloads old versions from Triton, and what canary analysis reads. Re-deploying the
application for a table change would restart the replicas instead (Ray Serve gives every
imperative deploy a new code version) and wait out their drain period, ~35 s with the
HAProxy ingress.

The actor is no single point of failure: Ray restarts it (``max_restarts=-1``), on
another node if its own is lost, and calls made meanwhile are retried. A restarted
actor starts empty under a new ``epoch``: replicas keep routing by the table they have
until the control plane publishes again, which it does as soon as it sees the epoch
change (``ControlService.run_due``), and replicas take the first table of a new epoch
whatever its number. Their counters are cumulative, so the first report of each replica
after a restart gives the canary analysis everything back.

Only the control plane creates the actor, so that where it runs is the control plane's
setting (``serve.control_actor_labels``: a soft preference for nodes with those Ray labels,
e.g. on-demand rather than spot nodes; by default the control plane's own node). Replicas
only look it up, and until it exists serve nothing new. An actor gone for good (killed
with ``no_restart``, say) leaves handles that can only fail: ``ControlStateLink`` drops
such a handle and looks the actor up again (the control plane creates it afresh).

Loading on demand (``infergate.control.residency``) meets here too. A replica that needs
a version Triton does not have calls ``warm``, which waits until the control plane,
pulling ``demands``, has loaded it and said so with ``settle``, naming the Tritons that
hold it now: one load however many replicas and requests wait. The control plane
publishes which Triton holds which version (``set_resident``; replicas pull it with the
table, and send each version's requests to a Triton that holds it), and replicas report which
versions they used and which have requests in flight (``report``'s ``activity``), which
``usage`` hands the control plane for its least-recently-used order. A restart loses
the waiting calls; Ray retries them on the new actor, whose demands start empty.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

import ray
from ray.exceptions import ActorDiedError
from ray.util.scheduling_strategies import (
    In,
    NodeAffinitySchedulingStrategy,
    NodeLabelSchedulingStrategy,
)

# The name carries the actor's protocol (its methods and what they return): a cluster kept
# running through an upgrade gets a new actor beside the old one's leftovers instead of
# calling an actor of the previous release with this release's methods.
# 2: epochs (table(epoch, known), publish returns (epoch, version)); 3: warm; 4: which
# Triton holds each version (warm and get_resident)
PROTOCOL = 4
STATE_ACTOR = f"infergate-control-v{PROTOCOL}"
log = logging.getLogger(__name__)
STATE_NAMESPACE = "infergate"
REPLICA_SILENT_AFTER_S = 10.0  # a replica not heard from for this long is gone


Table = tuple[str, int, list[dict[str, Any]]]  # epoch, version, served versions
Warmed = tuple[str | None, list[str]]  # why not loaded (None: it is), the Tritons holding it
Holders = dict[str, list[str]]  # each loaded version: the Tritons (host:port) holding it


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class ControlState:
    """The traffic table the control plane published, and what each replica reports."""

    def __init__(self) -> None:
        self.epoch = uuid.uuid4().hex  # new at every (re)start
        self.version = 0
        self.served: list[dict[str, Any]] = []
        self.reports: dict[str, tuple[float, int, dict[str, dict]]] = {}
        # Load on demand: what replicas wait for, what the control plane has not taken yet.
        self._waiting: dict[str, asyncio.Future[Warmed]] = {}
        self._demanded: dict[str, None] = {}  # in order of arrival
        self._demand = asyncio.Event()
        self.resident: tuple[int, Holders] = (0, {})
        self._last_used: dict[str, float] = {}
        self._busy: dict[str, tuple[float, set[str]]] = {}  # by replica

    def current_epoch(self) -> str:
        return self.epoch

    def publish(self, served: list[dict[str, Any]]) -> tuple[str, int]:
        """Publish ``served``; its ``(epoch, version)``."""
        self.version += 1
        self.served = served
        return self.epoch, self.version

    def table(self, epoch: str, known: int) -> Table | None:
        """The table if it is newer than the version ``known`` of ``epoch`` (or of any
        other epoch, once published in this one); None otherwise (the common case)."""
        newer = self.version > known if epoch == self.epoch else self.version > 0
        return (self.epoch, self.version, self.served) if newer else None

    def report(
        self,
        replica: str,
        table_version: int,
        counters: dict[str, dict],
        activity: dict[str, int] | None = None,
    ) -> int:
        """Take a replica's report (``activity``: the Triton models it used since its
        last report, with their requests in flight); the replicas heard from lately (they
        share each API key's rate limit)."""
        now = time.monotonic()
        self.reports[replica] = (now, table_version, counters)
        if activity is not None:
            for model in activity:
                self._last_used[model] = now
            self._busy[replica] = (now, {m for m, n in activity.items() if n > 0})
        return sum(now - seen < REPLICA_SILENT_AFTER_S for seen, _, _ in self.reports.values())

    def snapshot(self) -> list[dict[str, dict]]:
        return [counters for _, _, counters in self.reports.values()]

    def adopted(self, version: int) -> bool:
        """Every replica heard from lately runs ``version`` (or a newer table)."""
        now = time.monotonic()
        live = [v for seen, v, _ in self.reports.values() if now - seen < REPLICA_SILENT_AFTER_S]
        return all(v >= version for v in live)

    # -- load on demand -------------------------------------------------------------------

    async def warm(self, model: str, timeout_s: float) -> Warmed:
        """Wait until the control plane loaded Triton model ``model`` (no reason, and the
        Tritons that hold it), said why it cannot (the reason), or ``timeout_s`` passed
        ("still loading")."""
        self._last_used[model] = time.monotonic()
        waiting = self._waiting.get(model)
        if waiting is None:
            waiting = self._waiting[model] = asyncio.get_running_loop().create_future()
            self._demanded[model] = None
            self._demand.set()
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), timeout_s)
        except asyncio.TimeoutError:
            return "still loading", []

    async def demands(self, wait_s: float) -> list[str]:
        """The Triton models replicas asked for since the last call, once there is one
        or ``wait_s`` passed (the control plane's loop pulls this)."""
        if not self._demanded:
            self._demand.clear()
            try:
                await asyncio.wait_for(self._demand.wait(), wait_s)
            except asyncio.TimeoutError:
                return []
        demanded, self._demanded = list(self._demanded), {}
        return demanded

    def settle(self, model: str, reason: str | None, holders: list[str]) -> None:
        """``model`` is loaded in the ``holders`` (``reason`` None), or cannot be now:
        answer who waits."""
        waiting = self._waiting.pop(model, None)
        if waiting is not None and not waiting.done():
            waiting.set_result((reason, holders))

    def set_resident(self, placement: Holders) -> None:
        """The versions loaded in Triton now (by Triton model name), each with the Tritons
        that hold it."""
        self.resident = (self.resident[0] + 1, dict(sorted(placement.items())))

    def get_resident(self, epoch: str, known: int) -> tuple[int, Holders] | None:
        """The placement if newer than version ``known`` of ``epoch`` (or of any other
        epoch, once set in this one); None otherwise."""
        version = self.resident[0]
        newer = version > known if epoch == self.epoch else version > 0
        return self.resident if newer else None

    def usage(self) -> tuple[dict[str, float], list[str]]:
        """Seconds since each Triton model was last used, and those with requests in
        flight at a live replica's last report."""
        now = time.monotonic()
        ages = {model: now - used for model, used in self._last_used.items()}
        busy = {
            m
            for seen, models in self._busy.values()
            if now - seen < REPLICA_SILENT_AFTER_S
            for m in models
        }
        return ages, sorted(busy)


def control_state(labels: Mapping[str, str] | None = None) -> ray.actor.ActorHandle:
    """The cluster's ``ControlState``, created on first use: preferably on a node with
    ``labels`` (Ray node labels, e.g. ``ray.io/node-group``), else on this node if it can
    be; elsewhere when no such node is left (the preference is soft, restarts too)."""
    options: dict[str, Any] = {}
    if labels:
        soft = {key: In(value) for key, value in labels.items()}
        options["scheduling_strategy"] = NodeLabelSchedulingStrategy({}, soft=soft)
    else:
        try:
            node = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
        except Exception:  # a driver that cannot say its node (Ray Client): anywhere
            pass
    return ControlState.options(  # type: ignore[attr-defined]  # added by the Ray decorator
        name=STATE_ACTOR, namespace=STATE_NAMESPACE, lifetime="detached", get_if_exists=True,
        **options,
    ).remote()  # fmt: skip


def find_control_state() -> ray.actor.ActorHandle | None:
    """The cluster's ``ControlState`` if the control plane created it; None otherwise."""
    try:
        return ray.get_actor(STATE_ACTOR, namespace=STATE_NAMESPACE)
    except ValueError:  # no actor of that name (yet)
        return None


class ControlStateLink:
    """A handle on the ``ControlState`` actor, looked up again after the actor died for
    good. The control plane's link creates the actor when there is none (``labels``: where
    it prefers to run); a replica's only finds it."""

    def __init__(self, *, create: bool, labels: Mapping[str, str] | None = None) -> None:
        self._create = create
        self._labels = dict(labels or {})
        self._actor: ray.actor.ActorHandle | None = None

    def actor(self) -> ray.actor.ActorHandle | None:
        """The actor, or None while a replica finds none."""
        if self._actor is None:
            self._actor = control_state(self._labels) if self._create else find_control_state()
        return self._actor

    def failed(self, error: BaseException) -> None:
        """A call through the handle raised ``error``: if the actor is gone for good (a
        restarting one raises other errors, and its handle stays good), look it up again
        next time."""
        if isinstance(error, ActorDiedError) and self._actor is not None:
            log.warning("the ControlState actor is gone for good; looking it up again")
            self._actor = None

    def send(self, method: str, *args: Any) -> Any:
        """Call ``method`` of the actor without waiting: its ObjectRef, or None while
        there is no actor."""
        actor = self.actor()
        return None if actor is None else getattr(actor, method).remote(*args)

    async def ask(self, method: str, *args: Any, absent: Any = None) -> Any:
        """``method``'s answer, awaited (a replica's event loop), or ``absent`` while there
        is no actor; a failure is raised, a dead actor's handle dropped first."""
        pending = self.send(method, *args)
        if pending is None:
            return absent
        try:
            return await pending
        except Exception as error:
            self.failed(error)
            raise
