"""The HTTP surface of a front-end replica, independent of Ray Serve.

``Frontend.handle`` takes a Starlette request and returns a response. A replica
(``infergate.serving.replica``) builds one per traffic table, and the Ray Serve deployment
(``infergate.serve_app``) only hosts that replica. Every error becomes one JSON shape,
``{"error": ..., "type": ...}``, with the status its class carries (``infergate.http``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from infergate.config import FrontendSettings
from infergate.errors import (
    BackendUnavailable,
    ClientClosedRequest,
    Forbidden,
    InfergateError,
    ModelNotFound,
    Overloaded,
    RateLimited,
)
from infergate.http import SlowUploads, answer, error_response, json_response, read_body
from infergate.observe.metrics import TOTAL
from infergate.observe.monitor import Monitors
from infergate.observe.telemetry import NullTelemetry, Telemetry
from infergate.protocols import kserve_v2, openai_api
from infergate.protocols import rerank as rerank_api
from infergate.protocols.openapi import openapi_document
from infergate.protocols.routes import Route, Routes
from infergate.protocols.wire import (
    Answer,
    Check,
    Limits,
    Parse,
    Render,
    check_content_type,
    parse_predict,
)
from infergate.serving.access import OPEN, Access, Caller
from infergate.serving.batching import Backend
from infergate.serving.routing import ServedModel
from infergate.serving.runtime import ModelRuntime, Prediction

log = logging.getLogger(__name__)
READINESS_CACHE_S = 1.0
UNKNOWN_MODEL_LABEL = "_unknown"
# Status recorded for a request whose client went away before the answer (nginx's 499);
# no response is sent.
CLIENT_CLOSED_REQUEST = ClientClosedRequest.status
REFUSALS = (Forbidden.status, RateLimited.status)  # logged with the API key's id


class Frontend:
    """Routes requests to handlers; holds the served models of this replica."""

    def __init__(
        self,
        settings: FrontendSettings,
        backend: Backend,
        models: dict[str, ServedModel],
        readiness_probe: Callable[[ModelRuntime], Awaitable[bool]] | None = None,
        telemetry: Telemetry | None = None,
        monitors: Monitors | None = None,
        has_table: bool = True,
        loading: frozenset[str] = frozenset(),
        missing: tuple[str, ...] = (),
        access: Access | None = None,
        uploads: SlowUploads | None = None,
    ) -> None:
        """``has_table`` False: the control plane's traffic table has not arrived yet, so
        ``models`` is empty for now rather than for good. ``loading``: models of the table
        this replica cannot serve yet (it tries again); ``missing``: the versions of the
        table it could not load, as ``name vN``. ``access`` (API keys and their limits)
        and ``uploads`` (slow bodies) outlive a table, so the replica keeps them."""
        self.settings = settings
        self.has_table = has_table
        self.loading = loading
        self.missing = missing
        self.backend = backend
        self.models = models
        self.limits = Limits(
            max_body_bytes=settings.max_body_bytes,
            max_texts=settings.max_texts_per_request,
            max_chars_per_text=settings.max_chars_per_text,
        )
        self.access = access or Access(None)
        self.uploads = uploads or SlowUploads(settings.max_slow_uploads)
        self._probe = readiness_probe or self._answers
        self.telemetry = telemetry or NullTelemetry()
        self.monitors = monitors or Monitors(self.telemetry)
        self._ready_at = 0.0
        # Requests inside handle(): a replica that switches to a new front-end waits for
        # the old one's, which may still pick a version the new table left.
        self.in_flight = 0

    async def handle(self, request: Request) -> Response:
        self.in_flight += 1
        try:
            try:
                route, params = ROUTES.match(request.method, request.url.path)
            except InfergateError as error:
                return error_response(error)
            what = f"{request.method} {request.url.path}"
            handler = getattr(self, route.handler)

            async def authenticated() -> Response:
                if not route.public:
                    request.state.caller = self.access.authenticate(request.headers)
                return await handler(request, **params)

            return await answer(authenticated, what, route.error_body)
        finally:
            self.in_flight -= 1

    async def _predict_named(self, request: Request, name: str) -> Response:
        return await self.serve_inference(request, name, parse_predict, _predict_payload)

    async def _predict_default(self, request: Request) -> Response:
        name = self.settings.default_model
        return await self.serve_inference(request, name, parse_predict, _predict_payload)

    async def _rerank_named(self, request: Request, name: str) -> Response:
        return await self.serve_inference(
            request, name, rerank_api.rerank_parser(False), rerank_api.render_rerank,
            check=rerank_api.refuse_unless_ranking,
        )  # fmt: skip

    async def _rerank_default(self, request: Request) -> Response:
        """TEI's ``/rerank``: the body's model, or the only text-ranking model served."""

        def only_ranking_model() -> str | None:
            names = [m.name for m in self.visible(request) if rerank_api.reranks(m.task)]
            return names[0] if len(names) == 1 else None

        return await self.serve_inference(
            request, None, rerank_api.rerank_parser(True, only_ranking_model),
            rerank_api.render_tei_rerank, check=rerank_api.refuse_unless_ranking,
        )  # fmt: skip

    async def _openai_embeddings(self, request: Request) -> Response:
        return await self.serve_inference(
            request,
            None,
            openai_api.parse_embeddings,
            openai_api.render_embeddings,
            check=openai_api.refuse_unless_embeddings,
        )

    async def _openai_models(self, request: Request) -> Response:
        return json_response(openai_api.model_list(self.visible(request)))

    async def _openai_model(self, request: Request, model: str) -> Response:
        return json_response(openai_api.model_entry(self.model_for(request, model)))

    async def _describe(self, request: Request, name: str) -> Response:
        return json_response(self.model_for(request, name).describe())

    async def _list(self, request: Request) -> Response:
        return json_response({"models": [m.describe() for m in self.visible(request)]})

    async def _healthz(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def _openapi(self, request: Request) -> Response:
        return json_response(openapi_document())

    # -- the Open Inference Protocol (KServe V2); the bodies are infergate.protocols.kserve_v2's --

    async def _v2_infer(self, request: Request, name: str, version: str | None = None) -> Response:
        served = self.models.get(name)
        parse = kserve_v2.infer_parser(served.task if served else None, request.headers)
        return await self.serve_inference(
            request, name, parse, kserve_v2.render_infer, version,
            accept=kserve_v2.check_infer_content_type,
        )  # fmt: skip

    async def _v2_model_metadata(
        self, request: Request, name: str, version: str | None = None
    ) -> Response:
        model = self.model_for(request, name)
        runtimes = (model.pick(pinned=version),) if version is not None else model.versions
        return json_response(kserve_v2.model_metadata(model.name, model.task, runtimes))

    async def _v2_model_ready(
        self, request: Request, name: str, version: str | None = None
    ) -> Response:
        """Ready: the version named, or every version of the model, answers a request."""
        model = self.model_for(request, name)
        runtimes = (model.pick(pinned=version),) if version is not None else model.versions
        answers = await asyncio.gather(*(self._probe(r) for r in runtimes))
        failing = [r.served.version for r, ok in zip(runtimes, answers, strict=True) if not ok]
        if failing:
            raise BackendUnavailable(f"model {name!r} is not ready: version(s) {failing}")
        return json_response({"name": name, "ready": True})

    async def _v2_ready(self, request: Request) -> Response:
        await self._readyz(request)  # raises unless every served version answers
        return json_response({"ready": True})

    async def _v2_live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def _v2_server_metadata(self, request: Request) -> Response:
        return json_response(kserve_v2.server_metadata())

    def _model(self, name: str) -> ServedModel:
        model = self.models.get(name)
        if model is None and not self.has_table:
            # A replica that has not received its traffic table yet: the model may well
            # be served a moment later, so this is no 404.
            raise BackendUnavailable("the front-end is still starting; retry shortly")
        if model is None and name in self.loading:
            raise BackendUnavailable(f"model {name!r} is still loading; retry shortly")
        if model is None:
            known = ", ".join(sorted(self.models)) or "none yet"
            raise ModelNotFound(f"model {name!r} is not served; served models: {known}")
        return model

    def model_for(self, request: Request, name: str) -> ServedModel:
        """The served model ``name``, if the request's API key may use it."""
        _caller(request).check_model(name)
        return self._model(name)

    def visible(self, request: Request) -> list[ServedModel]:
        """The served models the request's API key may use."""
        key = _caller(request).key
        return [m for m in self.models.values() if key is None or key.may_use(m.name)]

    def _label(self, name: str | None) -> str:
        # Unknown names share one label value so a scan of made-up names cannot blow up
        # the metrics' cardinality.
        known = name is not None and (name in self.models or name in self.loading)
        return name if known and name is not None else UNKNOWN_MODEL_LABEL

    async def serve_inference(
        self,
        request: Request,
        name: str | None,
        parse: Parse,
        render: Render,
        version: str | None = None,
        check: Check | None = None,
        accept: Callable[[str | None], None] = check_content_type,
    ) -> Response:
        """One inference call in any protocol: ``parse`` turns the body into texts (and,
        with ``name`` None, names the model), ``render`` the prediction into the
        protocol's JSON (or a whole response). ``version`` pins a version (else
        ``x-model-version`` may); ``check`` may refuse the version picked before it runs;
        ``accept`` refuses the content types the protocol does not read. Every protocol
        shares the access control, the routing, the metrics and the canary's counters."""
        start = time.perf_counter()
        status, served_version, prediction = 500, "", None
        runtime: ModelRuntime | None = None
        label = self._label(name)
        caller = _caller(request)
        try:
            # A model named by the path is looked up (and refused) before the body is read.
            model = self.model_for(request, name) if name is not None else None
            accept(request.headers.get("content-type"))
            body = await read_body(
                request,
                self.settings.max_body_bytes,
                timeout_s=self.settings.body_timeout_s,
                slow=self.uploads,
            )
            parsed = parse(body, self.limits)
            if model is None:  # the body names it (OpenAI's, TEI's)
                name = parsed.model
                label = self._label(name)
                model = self.model_for(request, name or "")
            self.access.admit(caller, len(parsed.texts))
            pinned = version or request.headers.get("x-model-version")
            runtime = model.pick(request.headers.get("x-routing-key"), pinned)
            served_version = runtime.served.version
            if check is not None:
                check(parsed, runtime)
            prediction = await runtime.predict(parsed.texts, parsed.parameters, self.backend)
            rendered = render(Answer(model, runtime, prediction, parsed))
            response = rendered if isinstance(rendered, Response) else json_response(rendered)
            total_s = time.perf_counter() - start
            response.headers.update(_timing_headers(prediction, total_s, runtime))
            status = 200
            return response
        except InfergateError as error:
            status = error.status
            raise
        except asyncio.CancelledError:
            status = CLIENT_CLOSED_REQUEST
            raise
        finally:
            seconds = time.perf_counter() - start
            self.telemetry.request(label, served_version, status, prediction, seconds)
            if caller.key is not None:
                self.telemetry.caller(caller.id, label, status)
                if status in REFUSALS:  # the key's id, never the key (rate-limited: replica_logs)
                    log.info("key %s refused on model %s: %s", caller.id, label, status)
            # A request shed for load was never the version's to answer: the canary's
            # analysis must not count it, as an error or as a (short) latency.
            if runtime is not None and status != Overloaded.status:
                # A 499 is no error of the version's, but its wait is a latency of at least
                # ``seconds``: a canary that hangs until clients give up still gets judged.
                self.monitors.record(runtime, status, seconds, prediction)

    async def _readyz(self, request: Request) -> Response:
        runtimes = [r for m in self.models.values() for r in m.versions]
        if not runtimes:
            raise BackendUnavailable("no model is served yet")
        if self.missing:
            raise BackendUnavailable(f"not ready: not loaded yet: {', '.join(self.missing)}")
        now = time.monotonic()
        if now - self._ready_at > READINESS_CACHE_S:
            answers = await asyncio.gather(*(self._probe(r) for r in runtimes))
            failing = [r.triton_model for r, ok in zip(runtimes, answers, strict=True) if not ok]
            if failing:
                raise BackendUnavailable(f"not ready: {', '.join(failing)}")
            self._ready_at = now
        return json_response({"status": "ready", "models": sorted(self.models)})

    async def _answers(self, runtime: ModelRuntime) -> bool:
        """Ready means loaded in Triton and answering a real request."""
        try:
            probe = dict(runtime.task.probe_parameters)
            await runtime.predict(["readiness probe"], probe, self.backend)
        except InfergateError:
            return False
        return True


def _caller(request: Request) -> Caller:
    return getattr(request.state, "caller", OPEN)


def _predict_payload(answer: Answer) -> dict[str, Any]:
    return {
        "model": answer.model.name,
        "version": answer.runtime.served.version,
        "outputs": answer.prediction.outputs,
    }


ROUTES = Routes(
    Route("POST", "/v1/models/{name}/predict", "_predict_named"),
    Route("POST", "/predict", "_predict_default"),
    Route("POST", "/v1/models/{name}/rerank", "_rerank_named"),
    Route("POST", "/rerank", "_rerank_default"),
    Route("GET", "/v1/models/{name}", "_describe"),
    Route("GET", "/v1/models", "_list"),
    Route("GET", "/healthz", "_healthz", public=True),
    Route("GET", "/readyz", "_readyz", public=True),
    Route("GET", "/openapi.json", "_openapi", public=True),
    # OpenAI's API, for its clients (base_url ".../openai/v1"); its model list has its own
    # path because /v1/models is ours.
    Route("POST", "/v1/embeddings", "_openai_embeddings", openai_api.error_body),
    Route("POST", "/openai/v1/embeddings", "_openai_embeddings", openai_api.error_body),
    Route("GET", "/openai/v1/models", "_openai_models", openai_api.error_body),
    Route("GET", "/openai/v1/models/{model}", "_openai_model", openai_api.error_body),
    # KServe V2 (Open Inference Protocol), for tritonclient.http and KServe's clients.
    Route("POST", "/v2/models/{name}/infer", "_v2_infer"),
    Route("POST", "/v2/models/{name}/versions/{version}/infer", "_v2_infer"),
    Route("GET", "/v2/models/{name}/ready", "_v2_model_ready"),
    Route("GET", "/v2/models/{name}/versions/{version}/ready", "_v2_model_ready"),
    Route("GET", "/v2/models/{name}", "_v2_model_metadata"),
    Route("GET", "/v2/models/{name}/versions/{version}", "_v2_model_metadata"),
    Route("GET", "/v2/health/live", "_v2_live", public=True),
    Route("GET", "/v2/health/ready", "_v2_ready", public=True),
    Route("GET", "/v2", "_v2_server_metadata", public=True),
)


def _timing_headers(prediction: Prediction, total_s: float, runtime: ModelRuntime) -> dict:
    """The version that answered, and each stage's milliseconds."""
    headers = {"x-model-version": runtime.served.version, TOTAL.header: f"{total_s * 1e3:.3f}"}
    for stage, seconds in prediction.timings.stages():
        headers[stage.header] = f"{seconds * 1e3:.3f}"
    return headers
