"""The Ray Serve deployment hosting the front-end.

Replicas scale with Ray Serve autoscaling, apart from Triton. Each hosts one
``infergate.serving.replica.Replica`` and keeps it in step with the control plane through the
``ControlState`` actor (``infergate.control.state``): it pulls new traffic tables twice a
second and, apart from that (applying a table can take a while: tokenizers download),
reports the table it runs and its counters once a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc
from ray import serve
from starlette.requests import Request
from starlette.responses import Response
from tritonclient.grpc import service_pb2

from infergate.config import FrontendSettings, ServeSettings
from infergate.control.state import ControlStateLink, Warmed
from infergate.observe.telemetry import RayTelemetry
from infergate.protocols import v2_grpc
from infergate.serving.gc_tuning import collect_young_objects_rarely
from infergate.serving.replica import Replica
from infergate.serving.replica_logs import log_to_replica_file
from infergate.serving.tokenization import tokenize_serially
from infergate.triton.client import TritonBackend

log = logging.getLogger(__name__)
APP_NAME = "infergate"
POLL_INTERVAL_S = 0.5
REPORT_INTERVAL_S = 1.0
PAYLOAD_CLOSE_S = 5.0  # how long a replica shutting down waits for its last payload file


# No access log unless asked for (ServeSettings.access_log, or a Serve config's
# logging_config): infergate_requests_total counts every request already.
@serve.deployment(name="frontend", logging_config={"enable_access_log": False})
class FrontendDeployment:
    """Tokenizes, calls Triton over gRPC, post-processes; one instance per replica."""

    async def __init__(self) -> None:  # type: ignore[misc]  # Ray Serve awaits an async __init__
        tokenize_serially()
        collect_young_objects_rarely()
        log_to_replica_file()
        self._telemetry = RayTelemetry()
        self._replica = Replica(self._telemetry, connect=TritonBackend, warm=self._warm)
        self._state = ControlStateLink(create=False)  # the control plane creates it
        self._epoch = ""  # of the ControlState actor our table came from
        self._id = serve.get_replica_context().replica_id.unique_id
        self._sync_task = asyncio.get_running_loop().create_task(self._sync())

    async def reconfigure(self, config: dict[str, Any]) -> None:
        """New settings; on a replica's first start, also the current traffic table, so
        that it takes requests (Ray Serve marks it ready after this) knowing its models."""
        async with self._replica.applying:
            self._replica.configure(FrontendSettings.model_validate(config["settings"]))
            if self._replica.table_version == 0:
                try:
                    await self._pull_table()
                except Exception:  # the sync loop tries again; until then, 503s
                    log.exception("pulling the first traffic table failed")

    async def _sync(self) -> None:
        await asyncio.gather(self._pull_tables(), self._report_regularly())

    async def _pull_tables(self) -> None:
        replica = self._replica
        while True:
            if replica.settings is not None:  # else reconfigure has not run yet
                try:
                    async with replica.applying:
                        if await self._pull_table():  # the control plane waits for this:
                            self._state.send("report", *self._report_args())
                    if replica.warmer.enabled:
                        await self._pull_resident()
                    if replica.retry_due():
                        replica.start_retry()
                except Exception:  # the actor restarting, a registry hiccup: try again
                    log.exception("syncing the traffic table failed")
            await asyncio.sleep(POLL_INTERVAL_S)

    async def _pull_table(self) -> bool:
        """Apply the control plane's table if it is newer than ours; whether it was."""
        update = await self._state.ask("table", self._epoch, self._replica.table_version)
        if update is None:  # none newer, or no control plane has run yet
            return False
        self._epoch, version, served = update
        await self._replica.switch_table(version, served)
        return True

    async def _pull_resident(self) -> None:
        """Which versions the control plane has loaded in Triton, if that changed."""
        warmer = self._replica.warmer
        update = await self._state.ask("get_resident", self._epoch, warmer.resident_version)
        if update is not None:
            warmer.set_resident(*update)
            if self._replica.triton is not None:  # let go of Tritons named no more
                self._replica.triton.retain(u for held in warmer.holders.values() for u in held)

    async def _warm(self, model: str, timeout_s: float) -> Warmed:
        """Ask the control plane to load ``model`` into Triton: (None, the Tritons that
        hold it) once loaded, else (why not, [])."""
        warmed: Warmed = await self._state.ask(
            "warm", model, timeout_s, absent=("no control plane to load it", [])
        )
        return warmed

    async def _report_regularly(self) -> None:
        while True:
            if self._replica.settings is not None:
                try:
                    replicas = await self._state.ask("report", *self._report_args())
                    if replicas is not None:  # the count of live front-end replicas
                        self._replica.access.set_replicas(replicas)
                    self._replica.refresh_gauges()
                except Exception:
                    log.exception("reporting to the control plane failed")
            await asyncio.sleep(REPORT_INTERVAL_S)

    def _report_args(self) -> tuple[Any, ...]:
        """What a report to the control plane carries: this replica, the table it adopted,
        its counters and what it used."""
        replica = self._replica
        return self._id, replica.adopted, replica.counters(), replica.activity()

    async def __call__(self, request: Request) -> Response:
        return await self._replica.handle(request)

    # -- the Open Inference Protocol over gRPC (infergate.protocols.v2_grpc) ---------------
    # Ray Serve's gRPC ingress calls the method named as the RPC with the request message
    # and, by that keyword, the call's context (ray.serve.grpc_util.RayServegRPCContext).

    async def ServerLive(self, request: Any, grpc_context: Any) -> Any:
        return await self._rpc("ServerLive", request, grpc_context)

    async def ServerReady(self, request: Any, grpc_context: Any) -> Any:
        return await self._rpc("ServerReady", request, grpc_context)

    async def ModelReady(self, request: Any, grpc_context: Any) -> Any:
        return await self._rpc("ModelReady", request, grpc_context)

    async def ServerMetadata(self, request: Any, grpc_context: Any) -> Any:
        return await self._rpc("ServerMetadata", request, grpc_context)

    async def ModelMetadata(self, request: Any, grpc_context: Any) -> Any:
        return await self._rpc("ModelMetadata", request, grpc_context)

    async def ModelInfer(self, request: Any, grpc_context: Any) -> Any:
        return await self._rpc("ModelInfer", request, grpc_context)

    async def _rpc(self, rpc: str, request: Any, grpc_context: Any) -> Any:
        """The answer as ``service_pb2``'s response message. A refusal's status goes on
        the context and its (empty) message is dropped: Serve sends the user's code."""
        metadata = {key.lower(): value for key, value in grpc_context.invocation_metadata()}
        answer = await v2_grpc.answer(self._replica.frontend, rpc, request, metadata)
        if answer.code != v2_grpc.OK:
            grpc_context.set_code(grpc.StatusCode[answer.code])
            grpc_context.set_details(answer.details)
        if answer.trailers:
            grpc_context.set_trailing_metadata(list(answer.trailers))
        return getattr(service_pb2, f"{rpc}Response")(**answer.fields)

    def check_health(self) -> None:
        if self._sync_task.done():
            raise RuntimeError("the traffic table sync stopped")

    def __del__(self) -> None:
        """Ray Serve calls this when the replica shuts down: hand Ray the last totals, and
        let the payload log write what it holds (a few seconds at most)."""
        with contextlib.suppress(Exception):
            self._telemetry.flush()
        with contextlib.suppress(Exception):
            self._replica.payloads.close(timeout_s=PAYLOAD_CLOSE_S)


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
    return FrontendDeployment.options(  # type: ignore[attr-defined]  # added by the Ray decorator
        user_config={"settings": settings.model_dump(mode="json")},
        **replica_options(serve_settings),
    ).bind()


def build_app(args: dict[str, Any]) -> serve.Application:
    """Application builder for Serve config files (``import_path:
    infergate.serve_app:build_app``), as KubeRay's RayService uses: ``args`` are
    ``FrontendSettings`` fields. Scaling comes from the config's ``deployments`` section."""
    settings = FrontendSettings.model_validate(args)
    return FrontendDeployment.options(  # type: ignore[attr-defined]  # added by the Ray decorator
        user_config={"settings": settings.model_dump(mode="json")}
    ).bind()
