"""The control plane's side of loading on demand, in a thread of its own.

It pulls what the front-end replicas asked for from the ``ControlState`` actor, has the
control plane load each (``ControlPlane.load_on_demand``: one at a time, so two requests
never load one version twice), answers the replicas waiting with the Tritons that now
hold it, unloads idle versions, and publishes which Triton holds which version. It holds
none of the locks a reconcile waits on, so a cold start does not wait for a table change
to be adopted.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from infergate.control.reconcile import ControlPlane
from infergate.control.residency import NoRoom
from infergate.errors import ModelNotFound
from infergate.observe.metrics import COLD_STARTS, EVICTIONS, LOAD_DURATION, LOADED_VERSIONS

if TYPE_CHECKING:  # the actor's module imports Ray, which this one imports only to call it
    from infergate.control.state import Holders

log = logging.getLogger(__name__)
DEMAND_WAIT_S = 1.0  # the longest a pull of demands waits: idle unloads run this often
CALL_TIMEOUT_S = 10.0


class OnDemandLoader:
    """Serves the replicas' load requests for ``plane`` through the ``ControlState`` actor
    that ``link`` (a ``ControlStateLink``) holds, looked up again after it died for good."""

    def __init__(self, plane: ControlPlane, link: Any) -> None:
        self.plane = plane
        self.link = link
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._published: Holders | None = None  # the placement _actor was told
        self._actor: Any = None
        self._metrics: dict[str, Any] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="load-on-demand", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=CALL_TIMEOUT_S + DEMAND_WAIT_S)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.round()
            except Exception:  # the actor restarting, Triton away: the next round retries
                log.exception("a round of loading on demand failed")
                self._stop.wait(DEMAND_WAIT_S)

    def round(self) -> None:
        """Take the demands (waiting up to ``DEMAND_WAIT_S`` for one), load them, unload
        idle versions, publish the loaded set if it changed."""
        try:
            state = self.link.actor()
            if state is not self._actor:  # a new actor (the last one died): it knows nothing
                self._actor, self._published = state, None
            self._round(state)
        except Exception as error:
            self.link.failed(error)
            raise

    def _round(self, state: Any) -> None:
        import ray

        demands = ray.get(state.demands.remote(DEMAND_WAIT_S), timeout=CALL_TIMEOUT_S)
        try:
            ages, busy = ray.get(state.usage.remote(), timeout=CALL_TIMEOUT_S)
            self.plane.note_usage(ages, set(busy))
            for model in demands:
                reason = self._load(model)
                state.settle.remote(model, reason, self.plane.placement().get(model, []))
        except Exception:
            # Taken demands are asked for once: answer them, or their waiters would wait
            # on (settling one already answered does nothing).
            for model in demands:
                state.settle.remote(model, "the control plane could not load it now", [])
            raise
        self.plane.unload_idle()
        placement = self.plane.placement()
        if placement != self._published:
            ray.get(state.set_resident.remote(placement), timeout=CALL_TIMEOUT_S)
            self._published = placement
        self._gauge(LOADED_VERSIONS).set(self.plane.fullest())

    def _load(self, model: str) -> str | None:
        """Load ``model``; None once loaded, else why not (said to the client: no
        internals)."""
        try:
            seconds = self.plane.load_on_demand(model)
        except (NoRoom, ModelNotFound) as exc:  # passing: the client retries
            log.warning("loading %s on demand: %s", model, exc)
            return exc.message
        except Exception:
            log.exception("loading %s on demand failed", model)
            return "the backend could not load it"
        if seconds:
            version = self.plane.serving.get(model)
            tags = {"model": version.name, "version": version.version} if version else {}
            if tags:
                self._counter(COLD_STARTS).inc(1, tags)
                self._histogram().observe(seconds, tags)
        return None

    def on_residency(self, model: str, event: str, seconds: float) -> None:
        """``ControlPlane``'s hook: count unloads by reason."""
        if event in ("room", "idle"):
            self._counter(EVICTIONS).inc(1, {"reason": event})

    # Ray's metrics: created on first use, in the process that runs Ray.
    def _counter(self, metric: Any) -> Any:
        from ray.util.metrics import Counter

        if metric.name not in self._metrics:
            self._metrics[metric.name] = Counter(
                metric.full_name, description=metric.description, tag_keys=metric.labels
            )
        return self._metrics[metric.name]

    def _histogram(self) -> Any:
        from ray.util.metrics import Histogram

        metric = LOAD_DURATION
        if metric.name not in self._metrics:
            self._metrics[metric.name] = Histogram(
                metric.full_name, description=metric.description,
                boundaries=list(metric.buckets), tag_keys=metric.labels,
            )  # fmt: skip
        return self._metrics[metric.name]

    def _gauge(self, metric: Any) -> Any:
        from ray.util.metrics import Gauge

        if metric.name not in self._metrics:
            self._metrics[metric.name] = Gauge(
                metric.full_name, description=metric.description, tag_keys=metric.labels
            )
        return self._metrics[metric.name]
