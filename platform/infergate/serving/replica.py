"""A front-end replica apart from Ray Serve: the traffic table it routes by, the versions
it loaded for it, and the ``Frontend`` built from them.

``infergate.serve_app`` hosts one ``Replica`` per Ray Serve replica and feeds it the
control plane's tables; everything here runs without Ray, so tests build it as it is.

A table switch loads what the new table adds (downloads: off the event loop), builds a
new ``Frontend``, and counts as adopted only once the requests that could still reach a
version leaving it are done: Triton unloads a version once every replica adopted a table
without it. A version this replica cannot load yet (the artifact store not answering)
keeps its model answering 503 while the rest of the table serves, and is tried again
every ``RETRY_S``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from infergate.config import FrontendSettings
from infergate.errors import BackendUnavailable
from infergate.http import SlowUploads, error_response
from infergate.observe.monitor import Monitors
from infergate.observe.payloads import PayloadLog, open_payload_log
from infergate.observe.telemetry import Telemetry
from infergate.protocols.frontend import Frontend
from infergate.serving.access import Access
from infergate.serving.batching import BatchingBackend
from infergate.serving.loader import load_version
from infergate.serving.mirror import Mirror
from infergate.serving.redaction import Redactor
from infergate.serving.routing import ServedModel
from infergate.serving.runtime import Counted, ModelRuntime, drain
from infergate.serving.tritons import TritonChannel, Tritons
from infergate.serving.warming import Warm, Warmer
from infergate.versions import (
    CHAMPION,
    ServedVersion,
)

if TYPE_CHECKING:
    from infergate.registry import Registry

log = logging.getLogger(__name__)
CLOSE_POLL_S = 1.0  # how often a replaced Triton channel is checked for calls still out
RETRY_S = 5.0  # how often a version of the table this replica could not load is tried again

Key = tuple[str, str]  # (model name, version)


Loader = Callable[[ServedVersion, "Registry", Path], ModelRuntime]


class Replica:
    """One replica's routing state. ``connect(url, timeout_s)`` opens the Triton client
    (a ``Backend`` with ``url``, ``timeout_s`` and ``close()``); ``load`` reads a version's
    files; ``clock`` times the retries; ``warm`` asks the control plane to load a version
    (``Warmer``), used once the settings turn load on demand on."""

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        connect: Callable[[str, float], TritonChannel],
        load: Loader = load_version,
        clock: Callable[[], float] = time.monotonic,
        warm: Warm | None = None,
    ) -> None:
        self.telemetry = telemetry
        self._warm = warm
        self.warmer = Warmer()  # versions loaded on demand: across tables
        self.monitors = Monitors(telemetry)
        self.payloads = PayloadLog(FrontendSettings().payloads)  # off until configured
        # Shadow traffic, across tables; its records go to the same payload log.
        self.mirror = Mirror(self.monitors.version_counters, payloads=self.payloads)
        self._connect = connect
        self._load_version = load
        self._clock = clock
        self.settings: FrontendSettings | None = None
        self.access = Access(None)  # API keys and their buckets: they outlive tables
        self.uploads = SlowUploads(FrontendSettings().max_slow_uploads)
        self.frontend: Frontend | None = None
        self.triton: Tritons | None = None
        self.backend: BatchingBackend | None = None
        self.loaded: dict[Key, ModelRuntime] = {}
        self.served: list[ServedVersion] = []
        self.table_version = 0  # the table this replica routes by
        self.adopted = 0  # ... and the one it reports: once the versions it left are idle
        self.unloadable: set[Key] = set()  # of the table: retried every RETRY_S
        self._retried_at = 0.0
        self._retrying: asyncio.Task[None] | None = None
        self.applying = asyncio.Lock()  # one table change at a time
        self._closing: set[asyncio.Task[None]] = set()

    # -- settings and tables -------------------------------------------------------------

    def configure(self, settings: FrontendSettings) -> None:
        """New settings: a new Triton client if its address or deadline changed, a new
        batcher, and the current table built again with them."""
        self.settings = settings
        if (self.access.path, self.access.burst_s) != (
            settings.api_keys_file,
            settings.rate_limit_burst_s,
        ):
            self.access = Access(settings.api_keys_file, burst_s=settings.rate_limit_burst_s)
        self.uploads.limit = settings.max_slow_uploads
        warm = self._warm if settings.load_on_demand else None
        if (warm is not None, settings.cold_start_timeout_s) != (
            self.warmer.enabled,
            self.warmer.timeout_s,
        ):
            self.warmer = Warmer(warm, settings.cold_start_timeout_s)
        if settings.payloads != self.payloads.settings:
            self.payloads.close()  # its thread writes what it holds, then ends
            self.payloads = self.mirror.payloads = open_payload_log(
                settings.payloads, redact=self._redactor(settings)
            )
        triton = self.triton
        if triton is None or (triton.url, triton.timeout_s) != (
            settings.triton_grpc_url,
            settings.triton_timeout_s,
        ):
            if triton is not None and self.backend is not None:
                self._close_later(self.backend, triton)
            triton = self.triton = Tritons(
                self._connect(settings.triton_grpc_url, settings.triton_timeout_s),
                self._connect,
                lambda model: self.warmer.holders.get(model, ()),
            )
        # Calls in flight finish on the batcher they left from.
        self.backend = BatchingBackend.from_settings(triton, settings)
        self.apply(self.served, self.table_version)

    def _redactor(self, settings: FrontendSettings) -> Redactor | None:
        """What redacts the payload log's texts, when its settings ask for it (on the
        running loop: configure is called on the replica's)."""
        model = settings.payloads.redact_model
        if settings.payloads.texts != "redact" or model is None:
            return None
        return Redactor(
            model, self.champion, lambda: self.backend, asyncio.get_running_loop(),
            chunk=settings.max_texts_per_request,
        )  # fmt: skip

    def champion(self, name: str) -> ModelRuntime | None:
        """The loaded champion of model ``name`` in the current table, if any."""
        return next(
            (r for (model, _), r in self.loaded.items()
             if model == name and r.served.role == CHAMPION),
            None,
        )  # fmt: skip

    def _close_later(self, batcher: BatchingBackend, replaced: Tritons) -> None:
        """Close replaced Triton channels once ``batcher``, the last to call it, is idle:
        requests that began before the switch still finish on it (closing cancels calls)."""

        async def close() -> None:
            while not batcher.idle:
                await asyncio.sleep(CLOSE_POLL_S)
            await replaced.close()

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)  # a strong reference while it waits
        task.add_done_callback(self._closing.discard)

    def apply(self, served: list[ServedVersion], table_version: int) -> None:
        """Build the front-end for ``served``, reusing versions already loaded."""
        self._install(served, table_version, *self._load(served))

    async def switch_table(self, table_version: int, entries: list[dict[str, Any]]) -> None:
        """Route by the control plane's table ``table_version``; return once it counts as
        adopted (the requests that could still reach a version it left are done)."""
        assert self.settings is not None
        served = [ServedVersion.from_dict(entry) for entry in entries]
        keep = {(v.name, v.version) for v in served if not v.reloading}
        leaving = [runtime for key, runtime in self.loaded.items() if key not in keep]
        previous = self.frontend
        # Downloading a tokenizer blocks: keep the event loop serving.
        await asyncio.to_thread(self.apply, served, table_version)
        # Triton unloads (or reloads) a version once every replica reports a table without
        # it. Requests routed to it may still wait in a batching lane, and requests that
        # entered the previous front-end (some still reading their bodies) may yet pick
        # it: let them all finish first.
        under_way: list[Counted] = [*leaving, previous] if previous is not None else [*leaving]
        if not await drain(under_way, self.settings.triton_timeout_s):
            names = [runtime.triton_model for runtime in leaving]
            log.warning(
                "requests were still under way %.0f s after the table switch (versions "
                "leaving: %s)", self.settings.triton_timeout_s, names or "none",
            )  # fmt: skip
        self.adopted = table_version
        log.info("table %d: %s", table_version, [f"{v.name} v{v.version}" for v in served])

    def _load(self, served: list[ServedVersion]) -> tuple[dict[Key, ModelRuntime], set[Key]]:
        """The runtimes of ``served``, by (name, version): reused if loaded already, else
        loaded (this blocks: downloads). Also the versions that could not be loaded."""
        from infergate.registry import Registry  # MLflow: only where a table is loaded

        assert self.settings is not None
        registry = Registry(self.settings.tracking_uri)
        runtimes: dict[Key, ModelRuntime] = {}
        failed: set[Key] = set()
        for version in served:
            if version.reloading:  # Triton swaps its files: nothing of it may answer now
                continue
            key = (version.name, version.version)
            known = self.loaded.get(key)
            if known and known.served.source == version.source:
                runtimes[key] = known.with_served(version)
                continue
            try:
                runtimes[key] = self._load_version(
                    version, registry, self.settings.artifact_cache_dir
                )
            except Exception as exc:
                # The control plane read these files before publishing the table, so
                # this is most likely passing (an artifact store hiccup): the rest of the
                # table goes live now, this version is tried again every RETRY_S.
                if key in self.unloadable:
                    log.warning("%s v%s still cannot be loaded: %s", *key, exc)
                else:
                    log.exception("cannot load %s v%s yet", *key)
                failed.add(key)
        return runtimes, failed

    def _install(
        self,
        served: list[ServedVersion],
        table_version: int,
        runtimes: dict[Key, ModelRuntime],
        failed: set[Key],
    ) -> None:
        """Route by ``served`` with ``runtimes``. A model whose champion is among
        ``failed`` (or is being reloaded) answers 503 until it loads: its canary alone
        would take all of its traffic. So does a model none of whose versions loaded."""
        assert self.settings is not None and self.backend is not None
        grouped: dict[str, list[ModelRuntime]] = {}
        loading: set[str] = set()
        for version in served:
            runtime = runtimes.get((version.name, version.version))
            if runtime is None:
                if version.role == CHAMPION:
                    loading.add(version.name)
                continue
            grouped.setdefault(version.name, []).append(runtime)
            self.telemetry.weight(version.name, version.version, version.role, version.weight)
        loading.update({v.name for v in served} - grouped.keys())
        models = {
            name: ServedModel(name, runtimes[0].spec.task, tuple(runtimes))
            for name, runtimes in grouped.items()
            if name not in loading
        }
        self.frontend = Frontend(
            self.settings, self.backend, models, telemetry=self.telemetry,
            monitors=self.monitors, has_table=table_version > 0, loading=frozenset(loading),
            missing=tuple(f"{name} v{version}" for name, version in sorted(failed)),
            access=self.access, uploads=self.uploads, mirror=self.mirror, warmer=self.warmer,
        )  # fmt: skip
        self.loaded, self.served, self.table_version = runtimes, served, table_version
        self.unloadable, self._retried_at = failed, self._clock()

    # -- versions this replica could not load ---------------------------------------------

    def retry_due(self) -> bool:
        return (
            bool(self.unloadable)
            and (self._retrying is None or self._retrying.done())
            and self._clock() > self._retried_at + RETRY_S
        )

    def start_retry(self) -> None:
        """Try the table's unloadable versions again, in the background."""
        self._retrying = asyncio.get_running_loop().create_task(self.retry_unloadable())

    async def retry_unloadable(self) -> None:
        """Load the table's versions this replica could not load, off the table lock (a
        download can hang for minutes, and a new table must not wait for it); install
        them if the table is still the same."""
        served, table_version = self.served, self.table_version
        try:
            loaded = await asyncio.to_thread(self._load, served)
            async with self.applying:
                if self.table_version == table_version:
                    self._install(served, table_version, *loaded)
        except Exception:
            log.exception("loading the versions this replica lacks failed")
        finally:
            self._retried_at = self._clock()

    # -- serving and reporting ---------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        if self.frontend is None:
            return error_response(BackendUnavailable("the front-end is still starting"))
        return await self.frontend.handle(request)

    def activity(self) -> dict[str, int]:
        """The Triton models this replica used since the last call, with the requests
        each has in flight now: the control plane's least-recently-used order, and the
        versions it must not unload."""
        in_flight: dict[str, int] = {}
        for runtime in self.loaded.values():
            if runtime.in_flight:
                in_flight[runtime.triton_model] = runtime.in_flight
        for model in self.warmer.take_used():
            in_flight.setdefault(model, 0)
        return in_flight

    def counters(self) -> dict[str, dict]:
        """Per-version request counters, for the control plane's canary analysis."""
        return {key: counters.to_dict() for key, counters in self.monitors.counters.items()}

    def refresh_gauges(self) -> None:
        """Ray drops a gauge not set again within two export intervals; set ours again
        (an idle replica's totals included)."""
        for version in self.served:
            self.telemetry.weight(version.name, version.version, version.role, version.weight)
        self.monitors.publish()
        if self.payloads.enabled:
            self.telemetry.payloads(self.payloads.outcomes)
        self.telemetry.flush()
