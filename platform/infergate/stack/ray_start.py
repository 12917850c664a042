"""Starting Ray and Ray Serve in this process, or joining a cluster that runs them.

Used by the stack (``infergate up``) and by the benchmark's in-process server, which share
the fast-ingress settings below.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

from infergate.config import ServeSettings
from infergate.serving.ingress import write_error_pages
from infergate.stack.processes import descendants, free_port_block, reap

log = logging.getLogger(__name__)
RAY_START_ATTEMPTS = 3
GRPC_SERVICER = "tritonclient.grpc.service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server"

# Ray Serve's HAProxy ingress and throughput-optimised mode: on two cores a no-op
# deployment went from 165 to 2285 req/s at concurrency 32 with these two.
FAST_INGRESS_ENV = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    # HAProxy would send one log line per request to a Ray actor that parses it into
    # Ray's own HTTP metrics: 5-8 % of a core at 600 req/s, and infergate_requests_total
    # already counts every request. HAProxy's Prometheus endpoint stays.
    "RAY_SERVE_HAPROXY_METRICS_ENABLED": "0",
    # A replica leaving waits this long for HAProxy to stop sending it requests, then
    # refuses new connections (HAProxy sends a refused request to another replica) and
    # finishes the ones it holds. The 30 s default is sized for load balancers outside
    # the cluster. Here HAProxy had a new replica set 0.1 s after the controller changed
    # it and ran on it 0.6 s later. A stack's stop waits it out as well: `infergate down`
    # of an empty stack took 11.7 s at 5 and 8.8 s at 2.
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
    # HAProxy shares the box with the replicas and Triton; Ray Serve gives it four threads
    # whatever the cores. One per two cores: on two, one thread cost 0.10-0.12 ms of CPU
    # per request against 0.13-0.16 with four (four alternating runs at c=32).
    "RAY_SERVE_HAPROXY_NBTHREAD": str(max(1, (os.cpu_count() or 1) // 2)),
}


# Ray starts its workers 15 steps nicer than itself so that drivers keep their priority.
# Here the workers (the front-end replicas, and HAProxy which the proxy actor starts) are
# the serving path, beside Triton on the same cores: 15 steps down, the replicas waited
# for the model's threads, and the cores idled between batches (c=32: 809-880 -> 848-942
# req/s and idle 10-11 % -> 8-9 % in three alternating pairs; c=8: 547-616 -> 638-665).
WORKER_ENV = {
    "RAY_worker_niceness": "0",
    # Replicas tokenize on the calling thread (infergate.serving.tokenization.tokenize_serially);
    # set before the workers start, so that no replica writes its environment while
    # other threads run.
    "TOKENIZERS_PARALLELISM": "false",
    # The Serve controller (a worker too) runs its control loop every 0.1 s by default:
    # 4 % of a core on an idle two-core stack, 1.6 % every 0.5 s. Deploys, health checks
    # and scaling decisions then start up to 0.4 s later; autoscaling waits for seconds
    # of metrics anyway.
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    # The raylet stops its node when its agent (which exports the metrics) has not
    # registered within 30 s, Ray's default; on two busy cores an agent took longer. A
    # broken agent now fails later, a slow one no longer fails.
    "RAY_agent_register_timeout_ms": "120000",
}


def grpc_options(port: int) -> dict[str, Any] | None:
    """Ray Serve's gRPC ingress for the Open Inference Protocol on ``port`` (0: none).
    tritonclient ships the protocol's generated modules, so no protoc step: Serve routes
    ``/inference.GRPCInferenceService/<RPC>`` to the front-end deployment's method named
    ``<RPC>`` (``infergate.serve_app``); with HAProxy, its gRPC frontend forwards to each
    replica's own gRPC server (Ray's ``haproxy_templates.py``, ``grpc_frontend``)."""
    if not port:
        return None
    return {"port": port, "grpc_servicer_functions": [GRPC_SERVICER]}


# Where each replica's own gRPC server may listen (HAProxy forwards to it): Ray Serve's
# range is 40000-40999 on every node of every cluster, and on 2.53 those servers bind with
# SO_REUSEPORT (the option that should turn it off is passed as a string, which gRPC
# ignores). A second Ray Serve on the same host then binds the same port without an error,
# and the kernel hands half of HAProxy's connections to the other cluster's replica
# (seen here: every call on one connection answered "model ... is not served"). So each
# stack takes a block of ports nothing listens on yet, one of 40 at random.
REPLICA_GRPC_PORTS = (40000, 50000)
REPLICA_GRPC_BLOCK = 250


def use_fast_ingress(settings: ServeSettings, files: Path | None = None) -> None:
    """Ask the Ray Serve started next in this process for ``FAST_INGRESS_ENV`` (variables
    the caller exported win) and the ingress's ports and limits of ``settings``; with
    ``files``, HAProxy's configuration and error pages go there (``infergate.serving.ingress``)."""
    _export_defaults(FAST_INGRESS_ENV)
    if "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT" not in os.environ:
        block = free_port_block(*REPLICA_GRPC_PORTS, REPLICA_GRPC_BLOCK)
        os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT"] = str(block.start)
        os.environ["RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"] = str(block.stop)  # exclusive
    if files is not None:
        os.environ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"] = str(files / "haproxy.cfg")
    os.environ["RAY_SERVE_HAPROXY_STATS_PORT"] = str(settings.haproxy_stats_port)
    os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"] = str(settings.haproxy_metrics_port)
    os.environ["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"] = str(settings.fallback_proxy_port)
    os.environ["RAY_SERVE_FALLBACK_PROXY_GRPC_PORT"] = str(settings.fallback_proxy_grpc_port)
    os.environ["RAY_SERVE_HAPROXY_MAXCONN"] = str(settings.max_connections)
    os.environ["RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S"] = str(settings.client_idle_timeout_s)


def _export_defaults(env: dict[str, str]) -> None:
    """Set ``env`` for Ray to read at its start; variables the caller exported win."""
    for name, value in env.items():
        os.environ.setdefault(name, value)


# What a gRPC message holds beyond a REST body's worth of texts (its tensors' fields).
GRPC_FRAMING_BYTES = 64 * 1024


def grpc_message_limit(max_body_bytes: int) -> int:
    """The largest gRPC message the replicas read: a REST body's limit and its framing.
    Ray Serve's gRPC servers take up to 2 GiB by default, all of it read into memory
    before the front-end's own size check; past this, gRPC refuses a message from its
    length prefix (RESOURCE_EXHAUSTED), as HTTP stops reading at ``max_body_bytes``."""
    return max_body_bytes + GRPC_FRAMING_BYTES


def start_ray(
    settings: ServeSettings,
    keep: set[int],
    ingress_files: Path | None = None,
    grpc_port: int = 0,
    grpc_max_message_bytes: int | None = None,
) -> None:
    """Start Ray and Ray Serve here, or with ``settings.external`` join the cluster that
    ``RAY_ADDRESS`` names (e.g. ``ray://head:10001``), whose Serve is already running.

    The SIGTERM/SIGINT handlers this process had are kept: ``ray.init`` installs C-level
    ones that end the process before Python can stop what it started, orphaning Ray's own
    agents. ``keep`` are pids (our other children) that a failed attempt's clean-up must
    leave alone; ``ingress_files`` is where HAProxy's files go (see ``use_fast_ingress``);
    ``grpc_port`` (0: none) is where the Open Inference Protocol's gRPC service listens,
    and ``grpc_max_message_bytes`` the largest message it reads (``grpc_message_limit``;
    read by Ray's workers at their start).
    """
    if grpc_max_message_bytes is not None:
        _export_defaults({"RAY_SERVE_GRPC_MAX_MESSAGE_SIZE": str(grpc_max_message_bytes)})
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _start(settings, keep, ingress_files, grpc_port)
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


def _start(
    settings: ServeSettings, keep: set[int], ingress_files: Path | None, grpc_port: int
) -> None:
    import ray
    from ray import serve

    if settings.external:
        ray.init(logging_level=logging.WARNING, log_to_driver=False)
        return
    _export_defaults(WORKER_ENV)
    if settings.fast_ingress:
        use_fast_ingress(settings, ingress_files)
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init(
                # A new cluster of our own: without this, Ray joins whatever cluster
                # `ray start` last left running on this machine (/tmp/ray/ray_current_cluster).
                address="local",
                num_cpus=settings.ray_num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
                _metrics_export_port=settings.metrics_export_port,
            )
            break
        except Exception as exc:
            # Ray gives up when its GCS or raylet has not come up in time (here: when the
            # child that was to run it died before its exec, see infergate/__init__.py);
            # what the attempt left behind is cleaned up before the next one.
            if attempt == RAY_START_ATTEMPTS or "timed out" not in str(exc).lower():
                raise
            log.warning("Ray did not start in time (%s); trying again", exc)
            ray.shutdown()
            reap(descendants([os.getpid()]), exclude=keep)
    serve.start(
        http_options={"host": settings.host, "port": settings.port},
        grpc_options=grpc_options(grpc_port),
    )
    if settings.fast_ingress and ingress_files is not None:
        write_error_pages(ingress_files)  # before HAProxy's next reload: the app's deploy
