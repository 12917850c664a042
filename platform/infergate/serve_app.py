"""The Ray Serve deployment hosting the front-end.

Replicas scale with Ray Serve autoscaling, apart from Triton. What they serve
arrives as ``user_config`` so a new traffic table reaches running replicas through
``reconfigure`` without a restart.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from infergate.config import FrontendSettings, ServeSettings
from infergate.errors import BackendUnavailable
from infergate.frontend import Frontend, ServedModel, error_response
from infergate.monitor import Monitors
from infergate.registry import Registry, ServedVersion
from infergate.runtime import ModelRuntime
from infergate.telemetry import RayTelemetry
from infergate.triton.client import TritonBackend

log = logging.getLogger(__name__)
APP_NAME = "infergate"
STATS_ACTOR = "infergate-stats"
STATS_NAMESPACE = "infergate"


@ray.remote(num_cpus=0)
class StatsCollector:
    """Holds each replica's latest cumulative per-version counters for canary analysis."""

    def __init__(self) -> None:
        self.reports: dict[str, dict[str, dict]] = {}

    def report(self, replica: str, counters: dict[str, dict]) -> None:
        self.reports[replica] = counters

    def snapshot(self) -> list[dict[str, dict]]:
        return list(self.reports.values())


def stats_collector() -> ray.actor.ActorHandle:
    """The cluster's collector, created on first use."""
    return StatsCollector.options(
        name=STATS_ACTOR, namespace=STATS_NAMESPACE, lifetime="detached", get_if_exists=True
    ).remote()


@serve.deployment(name="frontend")
class FrontendDeployment:
    """Tokenizes, calls Triton over gRPC, post-processes; one instance per replica."""

    def __init__(self) -> None:
        self._frontend: Frontend | None = None
        self._backend: TritonBackend | None = None
        self._loaded: dict[tuple[str, str], ModelRuntime] = {}
        self._telemetry = RayTelemetry()
        self._collector = stats_collector()
        self._replica = serve.get_replica_context().replica_id.unique_id
        self._monitors = Monitors(self._telemetry, reporter=self._report)

    def _report(self, counters: dict[str, dict]) -> None:
        # Fire and forget: the request never waits for the collector.
        self._collector.report.remote(self._replica, counters)

    def reconfigure(self, config: dict[str, Any]) -> None:
        settings = FrontendSettings.model_validate(config["settings"])
        served = [ServedVersion(**entry) for entry in config["served"]]
        registry = Registry(settings.tracking_uri)
        if self._backend is None or self._backend.url != settings.triton_grpc_url:
            self._backend = TritonBackend(settings.triton_grpc_url, settings.triton_timeout_s)
        loaded: dict[tuple[str, str], ModelRuntime] = {}
        grouped: dict[str, list[ModelRuntime]] = {}
        for version in served:
            key = (version.name, version.version)
            known = self._loaded.get(key)
            runtime = (
                known.with_served(version)
                if known
                else ModelRuntime.load(version, registry, settings.artifact_cache_dir)
            )
            loaded[key] = runtime
            grouped.setdefault(version.name, []).append(runtime)
        self._loaded = loaded
        models = {
            name: ServedModel(name, runtimes[0].spec.task, tuple(runtimes))
            for name, runtimes in grouped.items()
        }
        for version in served:
            self._telemetry.weight(version.name, version.version, version.role, version.weight)
        self._frontend = Frontend(
            settings, self._backend, models, telemetry=self._telemetry, monitors=self._monitors
        )
        log.info("serving %s", ", ".join(f"{v.name} v{v.version}" for v in served) or "nothing")

    async def __call__(self, request: Request) -> Response:
        if self._frontend is None:
            return error_response(BackendUnavailable("the front-end is still starting"))
        return await self._frontend.handle(request)


def frontend_app(
    settings: FrontendSettings, served: list[ServedVersion], serve_settings: ServeSettings
) -> serve.Application:
    """The front-end application, ready for ``serve.run``."""
    autoscaling = serve_settings.autoscaling
    return FrontendDeployment.options(
        user_config={
            "settings": settings.model_dump(mode="json"),
            "served": [v.to_dict() for v in served],
        },
        max_ongoing_requests=serve_settings.max_ongoing_requests,
        autoscaling_config={
            "min_replicas": autoscaling.min_replicas,
            "max_replicas": autoscaling.max_replicas,
            "target_ongoing_requests": autoscaling.target_ongoing_requests,
        },
        # Half a CPU each: two replicas and Ray's own actors still fit on a 2-core box.
        ray_actor_options={"num_cpus": 0.5},
    ).bind()
