"""infergate without Triton: the same Ray Serve front-end, ONNX Runtime inside the replica.

Prices the Triton hop. Everything but the backend is the platform's own: HAProxy ingress,
a Ray Serve deployment with the platform's replica options and autoscaling, and
:class:`infergate.protocols.frontend.Frontend` with its parsing, limits, tokenizer, post-processing,
Ray metrics and drift monitors. The backend, :class:`OrtBackend`, replaces the gRPC call to
Triton with ONNX Runtime in the replica; concurrent requests are coalesced into one batch
(up to ``triton.max_batch_size`` rows, one batch at a time, full ones queued ahead) by the
platform's own :class:`~infergate.serving.batching.BatchingBackend`.

Not included: the replica's report of canary counters to the stats actor (once a second).

With ``--floor`` it serves :class:`FloorFrontend` instead, which answers without tokenizing
or inferring: the cost of Ray Serve's ingress and replica alone, a floor under any front-end
built on them (flat out, or paced to a given request rate).

Run by the harness as ``python -m infergate.bench.inprocess_server``; it serves until
SIGTERM. Configuration (ports aside) comes from ``load_config()``, so ``INFERGATE_*``
overrides apply here as they do to the platform.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from infergate.config import FrontendSettings, ServeSettings, TritonSettings, load_config
from infergate.errors import InfergateError
from infergate.observe.monitor import Monitors
from infergate.protocols.frontend import Frontend
from infergate.serve_app import replica_options
from infergate.serving.batching import BatchingBackend
from infergate.serving.gc_tuning import collect_young_objects_rarely
from infergate.serving.routing import ServedModel
from infergate.serving.runtime import ModelRuntime
from infergate.serving.tokenization import TextTokenizer, tokenize_serially
from infergate.versions import ServedVersion, Spec

log = logging.getLogger(__name__)


class OrtBackend:
    """The front-end's ``Backend`` protocol on ONNX Runtime in this process: each call is
    one ``session.run`` in a worker thread (ONNX Runtime releases the GIL, so the event
    loop keeps parsing and tokenizing meanwhile). The replica wraps it in the same
    :class:`~infergate.serving.batching.BatchingBackend` that coalesces its Triton calls.
    """

    def __init__(self, onnx_path: Path, *, threads: int) -> None:
        from infergate.bench.ceiling import make_session

        # No spin-waiting, as in the platform's Triton model: the replica shares the cores.
        self._session = make_session(onnx_path, threads, spinning=False)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ort")

    async def infer(
        self,
        model: str,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        output_name: str,
        *,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask, **(extra or {})}
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._run, output_name, feeds)
        except Exception as exc:
            log.warning("ONNX Runtime failed on %d rows: %s", len(input_ids), exc)
            raise InfergateError("The model failed on this batch.") from exc

    def _run(self, output_name: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
        return self._session.run([output_name], feeds)[0]


@serve.deployment(name="frontend")
class InprocessFrontend:
    """The platform's front-end over :class:`OrtBackend`; one instance per replica."""

    async def __init__(self, model: dict[str, Any], triton: dict, frontend: dict) -> None:  # type: ignore[misc]  # Ray Serve awaits an async __init__
        from infergate.observe.telemetry import RayTelemetry

        tokenize_serially()  # as the platform's replicas do
        collect_young_objects_rarely()
        t = TritonSettings.model_validate(triton)
        settings = FrontendSettings.model_validate(frontend)
        spec = Spec.from_dict(model["spec"])
        # One session with a thread per core (ONNX Runtime's default) has the machine,
        # as the ceiling does; one batch at a time, as many rows as Triton would take,
        # and full batches queued ahead as the platform's replicas queue them in Triton.
        backend = BatchingBackend(
            OrtBackend(Path(model["onnx"]), threads=0),
            max_rows=t.max_batch_size,
            max_in_flight=1,
            full_calls_ahead=settings.batch_full_calls_ahead,
        )
        served = ServedVersion(model["name"], model["version"], spec.task, model["onnx"])
        tokenizer = TextTokenizer.from_dir(Path(model["tokenizer"]), spec.max_length)
        runtime = ModelRuntime(served, spec, tokenizer)
        runtime.reference = json.loads(Path(model["reference"]).read_text())
        self._telemetry = telemetry = RayTelemetry()
        self._flushing = asyncio.get_running_loop().create_task(self._flush_forever())
        models = {served.name: ServedModel(served.name, spec.task, (runtime,))}
        self._frontend = Frontend(
            settings,
            backend,
            models,
            telemetry=telemetry,
            monitors=Monitors(telemetry),
        )

    async def __call__(self, request: Request) -> Response:
        return await self._frontend.handle(request)

    async def _flush_forever(self) -> None:
        """The metrics' totals go to Ray once a second, as the platform's replica does."""
        while True:
            await asyncio.sleep(1.0)
            self._telemetry.flush()


@serve.deployment(name="frontend")
class FloorFrontend:
    """The floor: reads and parses the request, answers one empty output per text. What
    Ray Serve's ingress and a replica cost before any tokenizing or inference.

    ``?delay_ms=D`` makes it wait D ms (without using CPU) before answering, so that a
    closed loop of N clients runs at about N / D requests a second: what Ray Serve costs
    per request at the rate a real front-end serves, rather than flat out."""

    async def __call__(self, request: Request) -> Response:
        texts = orjson.loads(await request.body())["inputs"]
        delay_ms = request.query_params.get("delay_ms")
        if delay_ms is not None:
            await asyncio.sleep(float(delay_ms) / 1e3)
        body = orjson.dumps({"model": "floor", "outputs": [{"label": None}] * len(texts)})
        return Response(body, media_type="application/json")


def build_app(model: dict[str, Any], serve_settings: ServeSettings, triton: TritonSettings,
              frontend: FrontendSettings) -> serve.Application:  # fmt: skip
    """The deployment with the replica options of ``infergate.serve_app.frontend_app``."""
    return InprocessFrontend.options(  # type: ignore[attr-defined]  # added by the Ray decorator
        **replica_options(serve_settings),
    ).bind(model, triton.model_dump(mode="json"), frontend.model_dump(mode="json"))


def main(argv: list[str] | None = None) -> int:
    import ray

    from infergate.stack.ray_start import start_ray

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--served-dir", type=Path, required=True, help="model.onnx, tokenizer/")
    parser.add_argument("--name", default="sentiment")
    parser.add_argument("--version", default="1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--haproxy-stats-port", type=int, required=True)
    parser.add_argument("--haproxy-metrics-port", type=int, required=True)
    parser.add_argument("--metrics-export-port", type=int, required=True)
    parser.add_argument(
        "--floor", action="store_true", help="serve the no-op FloorFrontend instead"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    config = load_config()
    served = args.served_dir.resolve()
    model = {
        "name": args.name,
        "version": args.version,
        "onnx": str(served / "model.onnx"),
        "tokenizer": str(served / "tokenizer"),
        "reference": str(served / "reference_stats.json"),
        "spec": json.loads((served / "infergate.json").read_text()),
    }
    serve_settings = config.serve.model_copy(
        update={
            "host": "127.0.0.1",
            "port": args.port,
            "external": False,
            "haproxy_stats_port": args.haproxy_stats_port,
            "haproxy_metrics_port": args.haproxy_metrics_port,
            "metrics_export_port": args.metrics_export_port,
        }
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        start_ray(serve_settings, keep=set())  # keeps the handlers just installed
        if args.floor:
            app = FloorFrontend.options(**replica_options(config.serve)).bind()  # type: ignore[attr-defined]  # added by the Ray decorator
        else:
            app = build_app(model, config.serve, config.triton, config.frontend)
        serve.run(app, name="infergate", route_prefix="/", blocking=False)
        log.info("serving %s v%s on port %d", args.name, args.version, args.port)
        while not stop.wait(0.5):
            pass
    finally:
        if ray.is_initialized():  # not when Ray itself failed to start
            try:
                serve.shutdown()
            finally:
                ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
