"""The Ray Serve deployment hosting the front-end, and the actor it shares with the
control plane.

Replicas scale with Ray Serve autoscaling, apart from Triton. The traffic table (which
versions, which weights) is published by the control plane to the ``ControlState``
actor and pulled by every replica twice a second. Re-deploying the application for a
table change would restart the replicas (Ray Serve gives every imperative deploy a
new code version) and wait out their drain period, ~35 s with the HAProxy ingress.
Replicas report back the table they run and their per-version counters, which is how
the control plane knows a change is live before unloading old versions from Triton.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.handlers
import re
import time
from collections.abc import Callable
from typing import Any

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from infergate.batching import BatchingBackend
from infergate.config import FrontendSettings, ServeSettings
from infergate.errors import BackendUnavailable
from infergate.frontend import Frontend, ServedModel, error_response
from infergate.monitor import Monitors
from infergate.registry import CHAMPION, Registry, ServedVersion
from infergate.runtime import ModelRuntime, drain
from infergate.telemetry import RayTelemetry
from infergate.tokenization import tokenize_serially
from infergate.triton.client import TritonBackend

log = logging.getLogger(__name__)
APP_NAME = "infergate"
STATE_ACTOR = "infergate-control"
STATE_NAMESPACE = "infergate"
POLL_INTERVAL_S = 0.5
REPORT_INTERVAL_S = 1.0
REPLICA_SILENT_AFTER_S = 10.0  # a replica not heard from for this long is gone
CLOSE_POLL_S = 1.0  # how often a replaced Triton channel is checked for calls still out
RETRY_S = 5.0  # how often a version of the table this replica could not load is tried again
REPEAT_WINDOW_S = 10.0  # a per-request warning of one kind is logged once per this
_DIGITS = re.compile(r"\d+")


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

    def report(self, replica: str, table_version: int, counters: dict[str, dict]) -> None:
        self.reports[replica] = (time.monotonic(), table_version, counters)

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


# No access log unless asked for (ServeSettings.access_log, or a Serve config's
# logging_config): infergate_requests_total counts every request already.
@serve.deployment(name="frontend", logging_config={"enable_access_log": False})
class FrontendDeployment:
    """Tokenizes, calls Triton over gRPC, post-processes; one instance per replica."""

    async def __init__(self) -> None:
        tokenize_serially()
        log_to_replica_file()
        self._settings: FrontendSettings | None = None
        self._frontend: Frontend | None = None
        self._backend: BatchingBackend | None = None
        self._loaded: dict[tuple[str, str], ModelRuntime] = {}
        self._served: list[ServedVersion] = []
        self._table_version = 0  # the table this replica routes by
        self._adopted = 0  # ... and the one it reports: once the versions it left are idle
        self._unloadable: set[tuple[str, str]] = set()  # of the table: retried every RETRY_S
        self._retried_at = 0.0
        self._retrying: asyncio.Task[None] | None = None
        self._telemetry = RayTelemetry()
        self._state = control_state()
        self._replica = serve.get_replica_context().replica_id.unique_id
        self._monitors = Monitors(self._telemetry)
        self._applying = asyncio.Lock()  # one table change at a time
        self._closing: set[asyncio.Task[None]] = set()
        self._sync_task = asyncio.get_running_loop().create_task(self._sync())

    async def reconfigure(self, config: dict[str, Any]) -> None:
        """New settings; on a replica's first start, also the current traffic table, so
        that it takes requests (Ray Serve marks it ready after this) knowing its models."""
        async with self._applying:
            self._configure(config)
            if self._table_version == 0:
                try:
                    await self._pull_table()
                except Exception:  # the sync loop tries again; until then, 503s
                    log.exception("pulling the first traffic table failed")

    def _configure(self, config: dict[str, Any]) -> None:
        self._settings = FrontendSettings.model_validate(config["settings"])
        settings = self._settings
        triton = self._backend.backend if self._backend else None
        if not isinstance(triton, TritonBackend) or (triton.url, triton.timeout_s) != (
            settings.triton_grpc_url,
            settings.triton_timeout_s,
        ):
            if isinstance(triton, TritonBackend) and self._backend is not None:
                self._close_later(self._backend, triton)
            triton = TritonBackend(settings.triton_grpc_url, settings.triton_timeout_s)
        # Calls in flight finish on the batcher they left from.
        self._backend = BatchingBackend.from_settings(triton, settings)
        self._apply(self._served, self._table_version)

    def _close_later(self, batcher: BatchingBackend, replaced: TritonBackend) -> None:
        """Close a replaced Triton channel once ``batcher``, the last to call it, is idle:
        requests that began before the switch still finish on it (closing cancels calls)."""

        async def close() -> None:
            while not batcher.idle:
                await asyncio.sleep(CLOSE_POLL_S)
            await replaced.close()

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)  # a strong reference while it waits
        task.add_done_callback(self._closing.discard)

    def _apply(self, served: list[ServedVersion], table_version: int) -> None:
        """Build the front-end for ``served``, reusing versions already loaded."""
        self._install(served, table_version, *self._load(served))

    def _load(
        self, served: list[ServedVersion]
    ) -> tuple[dict[tuple[str, str], ModelRuntime], set[tuple[str, str]]]:
        """The runtimes of ``served``, by (name, version): reused if loaded already, else
        loaded (this blocks: downloads). Also the versions that could not be loaded."""
        assert self._settings is not None
        registry = Registry(self._settings.tracking_uri)
        runtimes: dict[tuple[str, str], ModelRuntime] = {}
        failed: set[tuple[str, str]] = set()
        for version in served:
            if version.reloading:  # Triton swaps its files: nothing of it may answer now
                continue
            key = (version.name, version.version)
            known = self._loaded.get(key)
            if known and known.served.source == version.source:
                runtimes[key] = known.with_served(version)
                continue
            try:
                runtimes[key] = ModelRuntime.load(
                    version, registry, self._settings.artifact_cache_dir
                )
            except Exception as exc:
                # The control plane read these files before publishing the table, so
                # this is most likely passing (an artifact store hiccup): the rest of the
                # table goes live now, this version is tried again every RETRY_S.
                if key in self._unloadable:
                    log.warning("%s v%s still cannot be loaded: %s", *key, exc)
                else:
                    log.exception("cannot load %s v%s yet", *key)
                failed.add(key)
        return runtimes, failed

    def _install(
        self,
        served: list[ServedVersion],
        table_version: int,
        runtimes: dict[tuple[str, str], ModelRuntime],
        failed: set[tuple[str, str]],
    ) -> None:
        """Route by ``served`` with ``runtimes``. A model whose champion is among
        ``failed`` (or is being reloaded) answers 503 until it loads: its canary alone
        would take all of its traffic. So does a model none of whose versions loaded."""
        assert self._settings is not None and self._backend is not None
        grouped: dict[str, list[ModelRuntime]] = {}
        loading: set[str] = set()
        for version in served:
            runtime = runtimes.get((version.name, version.version))
            if runtime is None:
                if version.role == CHAMPION:
                    loading.add(version.name)
                continue
            grouped.setdefault(version.name, []).append(runtime)
            self._telemetry.weight(version.name, version.version, version.role, version.weight)
        loading.update({v.name for v in served} - grouped.keys())
        models = {
            name: ServedModel(name, runtimes[0].spec.task, tuple(runtimes))
            for name, runtimes in grouped.items()
            if name not in loading
        }
        self._frontend = Frontend(
            self._settings, self._backend, models, telemetry=self._telemetry,
            monitors=self._monitors, has_table=table_version > 0, loading=frozenset(loading),
            missing=tuple(f"{name} v{version}" for name, version in sorted(failed)),
        )  # fmt: skip
        self._loaded, self._served, self._table_version = runtimes, served, table_version
        self._unloadable, self._retried_at = failed, time.monotonic()

    async def _retry_unloadable(self) -> None:
        """Load the table's versions this replica could not load, off the table lock (a
        download can hang for minutes, and a new table must not wait for it); install
        them if the table is still the same."""
        served, table_version = self._served, self._table_version
        try:
            loaded = await asyncio.to_thread(self._load, served)
            async with self._applying:
                if self._table_version == table_version:
                    self._install(served, table_version, *loaded)
        except Exception:
            log.exception("loading the versions this replica lacks failed")
        finally:
            self._retried_at = time.monotonic()

    async def _sync(self) -> None:
        """Pull new traffic tables and, apart from that (applying one can take a while:
        tokenizers download), report the table in use and the counters."""
        await asyncio.gather(self._pull_tables(), self._report_regularly())

    async def _pull_tables(self) -> None:
        while True:
            if self._settings is not None:  # else reconfigure has not run yet
                try:
                    async with self._applying:
                        if await self._pull_table():
                            self._report()  # the control plane waits for this
                    if self._retry_due():
                        self._retrying = asyncio.get_running_loop().create_task(
                            self._retry_unloadable()
                        )
                except Exception:  # the actor restarting, a registry hiccup: try again
                    log.exception("syncing the traffic table failed")
            await asyncio.sleep(POLL_INTERVAL_S)

    def _retry_due(self) -> bool:
        return (
            bool(self._unloadable)
            and (self._retrying is None or self._retrying.done())
            and time.monotonic() > self._retried_at + RETRY_S
        )

    async def _report_regularly(self) -> None:
        while True:
            if self._settings is not None:
                try:
                    self._report()
                    self._refresh_gauges()
                except Exception:
                    log.exception("reporting to the control plane failed")
            await asyncio.sleep(REPORT_INTERVAL_S)

    def _report(self) -> None:
        counters = {k: c.to_dict() for k, c in self._monitors.counters.items()}
        self._state.report.remote(self._replica, self._adopted, counters)

    async def _pull_table(self) -> bool:
        """Apply the control plane's table if it is newer than ours; whether it was."""
        update = await self._state.table.remote(self._table_version)
        if update is None:
            return False
        version, entries = update
        served = [ServedVersion(**entry) for entry in entries]
        keep = {(v.name, v.version) for v in served if not v.reloading}
        leaving = [runtime for key, runtime in self._loaded.items() if key not in keep]
        previous = self._frontend
        # Downloading a tokenizer blocks: keep the event loop serving.
        await asyncio.to_thread(self._apply, served, version)
        # Triton unloads (or reloads) a version once every replica reports a table without
        # it. Requests routed to it may still wait in a batching lane, and requests that
        # entered the previous front-end (some still reading their bodies) may yet pick
        # it: let them all finish first.
        assert self._settings is not None
        under_way = [*leaving, previous] if previous is not None else leaving
        if not await drain(under_way, self._settings.triton_timeout_s):
            names = [runtime.triton_model for runtime in leaving]
            log.warning(
                "requests were still under way %.0f s after the table switch (versions "
                "leaving: %s)", self._settings.triton_timeout_s, names or "none",
            )  # fmt: skip
        self._adopted = version
        log.info("table %d: %s", version, [f"{v.name} v{v.version}" for v in served])
        return True

    def _refresh_gauges(self) -> None:
        """Ray drops a gauge not set again within two export intervals; set ours again
        (an idle replica's totals included)."""
        for version in self._served:
            self._telemetry.weight(version.name, version.version, version.role, version.weight)
        self._monitors.publish()
        self._telemetry.flush()

    async def __call__(self, request: Request) -> Response:
        if self._frontend is None:
            return error_response(BackendUnavailable("the front-end is still starting"))
        return await self._frontend.handle(request)

    def check_health(self) -> None:
        if self._sync_task.done():
            raise RuntimeError("the traffic table sync stopped")

    def __del__(self) -> None:
        """Ray Serve calls this when the replica shuts down: hand Ray the last totals."""
        with contextlib.suppress(Exception):
            self._telemetry.flush()


def log_to_replica_file() -> None:
    """Write infergate's log records to this replica's log file, as Ray Serve does its own.

    Ray Serve gives only its ``ray.serve`` logger a handler in a replica: the records of
    other loggers reached no file, warnings and tracebacks included. Its records wait in a
    buffer (a thousand of them when tuned for throughput, as here) until an error flushes
    it; ours are few and must show when they happen, so they go to the file at once."""
    ours = logging.getLogger("infergate")
    ours.setLevel(logging.INFO)
    ours.propagate = False
    for handler in logging.getLogger("ray.serve").handlers:
        if isinstance(handler, logging.handlers.MemoryHandler) and handler.target is not None:
            handler = handler.target
        if handler not in ours.handlers:
            ours.addHandler(handler)
    # The loggers that write a line per failed request: while Triton is down, every
    # request fails, and a thousand lines a second would bury everything else.
    for name in ("infergate.frontend", "infergate.triton.client"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RepeatLimit) for f in logger.filters):
            logger.addFilter(RepeatLimit(REPEAT_WINDOW_S))


class RepeatLimit(logging.Filter):
    """Lets one record of a kind through per ``window_s``; the next one that passes says
    how many were held back. Records of a kind share their message up to its numbers (row
    counts, timings): the same failure of two models makes two kinds."""

    MAX_KINDS = 1000  # a flood of unlike messages must not grow the table without end

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._kinds: dict[str, list[float | int]] = {}  # kind -> [last passed at, held back]

    def filter(self, record: logging.LogRecord) -> bool:
        now = self._clock()
        kind = f"{record.levelno}:{_DIGITS.sub('#', record.getMessage())}"
        seen = self._kinds.get(kind)
        if seen is not None and now - seen[0] < self.window_s:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            record.msg = (
                f"{record.getMessage()} ({seen[1]} more like it were not logged in the "
                f"{now - seen[0]:.0f} s since the last one shown)"
            )
            record.args = ()
        if len(self._kinds) >= self.MAX_KINDS:
            self._kinds = {k: v for k, v in self._kinds.items() if now - v[0] < self.window_s}
            if len(self._kinds) >= self.MAX_KINDS:  # all of them recent: forget the counts
                self._kinds.clear()
        self._kinds[kind] = [now, 0]
        return True


def replica_options(serve_settings: ServeSettings) -> dict[str, Any]:
    """Scaling and placement of front-end replicas (shared with the benchmark's variant)."""
    autoscaling = serve_settings.autoscaling
    return {
        "max_ongoing_requests": serve_settings.max_ongoing_requests,
        "autoscaling_config": {
            "min_replicas": autoscaling.min_replicas,
            "max_replicas": autoscaling.max_replicas,
            "target_ongoing_requests": autoscaling.target_ongoing_requests,
        },
        # Half a CPU each: two replicas and Ray's own actors still fit on a 2-core box.
        "ray_actor_options": {"num_cpus": 0.5},
        "logging_config": {"enable_access_log": serve_settings.access_log},
    }


def frontend_app(settings: FrontendSettings, serve_settings: ServeSettings) -> serve.Application:
    """The front-end application, ready for ``serve.run``."""
    return FrontendDeployment.options(
        user_config={"settings": settings.model_dump(mode="json")},
        **replica_options(serve_settings),
    ).bind()


def build_app(args: dict[str, Any]) -> serve.Application:
    """Application builder for Serve config files (``import_path:
    infergate.serve_app:build_app``), as KubeRay's RayService uses: ``args`` are
    ``FrontendSettings`` fields. Scaling comes from the config's ``deployments`` section."""
    settings = FrontendSettings.model_validate(args)
    return FrontendDeployment.options(
        user_config={"settings": settings.model_dump(mode="json")}
    ).bind()
