"""The HTTP surface of a front-end replica, independent of Ray Serve.

``Frontend.handle`` takes a Starlette request and returns a response. A replica
(``infergate.serving.replica``) builds one per traffic table, and the Ray Serve deployment
(``infergate.serve_app``) only hosts that replica. The handlers here only adapt: they read
and parse a body, hand plain values to the inference path
(``infergate.serving.inference``), and render its prediction in their protocol. Every
error becomes one JSON shape, ``{"error": ..., "type": ...}``, with the status its class
carries (``infergate.http``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from infergate.config import FrontendSettings
from infergate.errors import InfergateError
from infergate.http import (
    JSON,
    SlowUploads,
    answer,
    error_response,
    json_bytes,
    json_response,
    read_body,
)
from infergate.observe.monitor import Monitors
from infergate.observe.telemetry import Telemetry
from infergate.protocols import kserve_v2, openai_api, openapi, tei_answers
from infergate.protocols import rerank as rerank_api
from infergate.protocols.routes import Route, Routes
from infergate.protocols.tei_routes import TeiHandlers
from infergate.protocols.wire import (
    Answer,
    Check,
    Limits,
    Parse,
    Render,
    check_content_type,
    parse_predict,
    timing_headers,
)
from infergate.serving.access import OPEN, Access, Caller
from infergate.serving.batching import Backend
from infergate.serving.inference import InferencePath, Probe
from infergate.serving.mirror import Mirror
from infergate.serving.routing import ServedModel
from infergate.serving.warming import Warmer


class Frontend(TeiHandlers):
    """Routes requests to handlers; holds the served models of this replica."""

    def __init__(
        self,
        settings: FrontendSettings,
        backend: Backend,
        models: dict[str, ServedModel],
        readiness_probe: Probe | None = None,
        telemetry: Telemetry | None = None,
        monitors: Monitors | None = None,
        has_table: bool = True,
        loading: frozenset[str] = frozenset(),
        missing: tuple[str, ...] = (),
        warmer: Warmer | None = None,
        access: Access | None = None,
        uploads: SlowUploads | None = None,
        mirror: Mirror | None = None,
    ) -> None:
        """The models and the rest of the inference path are
        :class:`~infergate.serving.inference.InferencePath`'s (see there).
        ``uploads`` (slow bodies) and ``mirror`` (shadow traffic under way) outlive a
        table, so the replica keeps them."""
        self.settings = settings
        self.path = InferencePath(
            backend, models, access=access, telemetry=telemetry, monitors=monitors,
            readiness_probe=readiness_probe, has_table=has_table, loading=loading,
            missing=missing, mirror=mirror, warmer=warmer,
        )  # fmt: skip
        self.models = self.path.models
        self.monitors = self.path.monitors
        self.missing = self.path.missing
        self.access = self.path.access
        self.limits = Limits(
            max_body_bytes=settings.max_body_bytes,
            max_texts=settings.max_texts_per_request,
            max_chars_per_text=settings.max_chars_per_text,
        )
        self.uploads = uploads or SlowUploads(settings.max_slow_uploads)
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

    async def _json_body(self, request: Request) -> bytes:
        check_content_type(request.headers.get("content-type"))
        settings = self.settings
        return await read_body(
            request, settings.max_body_bytes, timeout_s=settings.body_timeout_s, slow=self.uploads
        )

    async def _openai_models(self, request: Request) -> Response:
        return json_response(openai_api.model_list(self.visible(request)))

    async def _openai_model(self, request: Request, model: str) -> Response:
        return json_response(openai_api.model_entry(self.model_for(request, model)))

    async def _describe(self, request: Request, name: str) -> Response:
        return json_response(self.model_for(request, name).describe(self._is_loaded))

    async def _list(self, request: Request) -> Response:
        models = [m.describe(self._is_loaded) for m in self.visible(request)]
        return json_response({"models": models})

    def _is_loaded(self, triton_model: str) -> bool:
        return self.path.warmer.is_loaded(triton_model)

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
        await self.path.model_ready(self.model_for(request, name), version)
        return json_response({"name": name, "ready": True})

    async def _v2_ready(self, request: Request) -> Response:
        await self._readyz(request)  # raises unless every served version answers
        return json_response({"ready": True})

    async def _v2_live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def _v2_server_metadata(self, request: Request) -> Response:
        return json_response(kserve_v2.server_metadata())

    def model_for(self, request: Request, name: str) -> ServedModel:
        """The served model ``name``, if the request's API key may use it."""
        return self.path.model_for(_caller(request), name)

    def visible(self, request: Request) -> list[ServedModel]:
        """The served models the request's API key may use."""
        return self.path.visible(_caller(request))

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
        shares the access control, the routing, the metrics and the canary's counters:
        the inference path's."""
        caller = _caller(request)
        with self.path.call(caller, name) as call:
            # A model named by the path is looked up (and refused) before the body is read.
            model = self.path.model_for(caller, name) if name is not None else None
            accept(request.headers.get("content-type"))
            body = await read_body(
                request,
                self.settings.max_body_bytes,
                timeout_s=self.settings.body_timeout_s,
                slow=self.uploads,
            )
            parsed = parse(body, self.limits)
            if model is None:  # the body names it (OpenAI's, TEI's)
                model = self.path.named(call, parsed.model)
            prediction = await self.path.infer(
                call, model, parsed.texts, parsed.parameters,
                routing_key=request.headers.get("x-routing-key"),
                pinned=version or request.headers.get("x-model-version"),
                check=functools.partial(check, parsed) if check is not None else None,
            )  # fmt: skip
            runtime = call.runtime
            assert runtime is not None
            rendered = render(Answer(model, runtime, prediction, parsed))
            if isinstance(rendered, Response):
                rendered.headers.update(timing_headers(prediction, call.elapsed_s(), runtime))
                return rendered
            # The headers given to the response rather than added to it: Starlette adds
            # one at a time, each after a scan of those it has.
            content = json_bytes(rendered)
            headers = timing_headers(prediction, call.elapsed_s(), runtime)
            return Response(content, headers=headers, media_type=JSON)

    async def _readyz(self, request: Request) -> Response:
        return json_response({"status": "ready", "models": await self.path.ready()})


def _caller(request: Request) -> Caller:
    return getattr(request.state, "caller", OPEN)


def _predict_payload(answer: Answer) -> dict[str, Any]:
    return {
        "model": answer.model.name,
        "version": answer.runtime.served.version,
        "outputs": answer.prediction.outputs,
    }


ROUTES = Routes(
    Route("POST", "/v1/models/{name}/predict", "_predict_named", doc=openapi.PREDICT_NAMED),
    Route("POST", "/predict", "_predict_default", doc=openapi.PREDICT_DEFAULT),
    Route("POST", "/v1/models/{name}/rerank", "_rerank_named", doc=openapi.RERANK_NAMED),
    Route("POST", "/rerank", "_rerank_default", doc=openapi.RERANK_TEI),
    Route("GET", "/v1/models/{name}", "_describe", doc=openapi.MODEL_INFO),
    Route("GET", "/v1/models", "_list", doc=openapi.MODEL_LIST),
    Route("GET", "/healthz", "_healthz", public=True, doc=openapi.HEALTHZ),
    Route("GET", "/readyz", "_readyz", public=True, doc=openapi.READYZ),
    Route("GET", "/openapi.json", "_openapi", public=True),
    # OpenAI's API, for its clients (base_url ".../openai/v1"); its model list has its own
    # path because /v1/models is ours.
    Route("POST", "/v1/embeddings", "_openai_embeddings", openai_api.error_body,
          doc=openapi.EMBEDDINGS),
    Route("POST", "/openai/v1/embeddings", "_openai_embeddings", openai_api.error_body,
          doc=openapi.EMBEDDINGS),
    Route("GET", "/openai/v1/models", "_openai_models", openai_api.error_body,
          doc=openapi.OPENAI_MODELS),
    Route("GET", "/openai/v1/models/{model}", "_openai_model", openai_api.error_body,
          doc=openapi.OPENAI_MODEL),
    # Text Embeddings Inference's API, one base URL per model, for TEI's clients
    # (huggingface_hub's InferenceClient(base_url=".../tei/{name}")).
    Route("POST", "/tei/{name}", "_tei_root", tei_answers.error_body, doc=openapi.TEI_ROOT),
    Route("POST", "/tei/{name}/embed", "_tei_embed", tei_answers.error_body,
          doc=openapi.TEI_EMBED),
    Route("POST", "/tei/{name}/embed_sparse", "_tei_embed_sparse", tei_answers.error_body,
          doc=openapi.TEI_EMBED_SPARSE),
    Route("POST", "/tei/{name}/predict", "_tei_predict", tei_answers.error_body,
          doc=openapi.TEI_PREDICT),
    Route("POST", "/tei/{name}/rerank", "_tei_rerank", tei_answers.error_body,
          doc=openapi.TEI_RERANK),
    Route("POST", "/tei/{name}/similarity", "_tei_similarity", tei_answers.error_body,
          doc=openapi.TEI_SIMILARITY),
    Route("POST", "/tei/{name}/tokenize", "_tei_tokenize", tei_answers.error_body,
          doc=openapi.TEI_TOKENIZE),
    Route("POST", "/tei/{name}/decode", "_tei_decode", tei_answers.error_body,
          doc=openapi.TEI_DECODE),
    Route("GET", "/tei/{name}/info", "_tei_info", tei_answers.error_body, doc=openapi.TEI_INFO),
    Route("POST", "/tei/{name}/embed_all", "_tei_embed_all", tei_answers.error_body,
          doc=openapi.TEI_EMBED_ALL),
    Route("GET", "/tei/{name}/health", "_tei_health", tei_answers.error_body,
          doc=openapi.TEI_HEALTH),
    Route("GET", "/tei/{name}/metrics", "_tei_metrics", tei_answers.error_body,
          doc=openapi.TEI_METRICS),
    # KServe V2 (Open Inference Protocol), for tritonclient.http and KServe's clients.
    Route("POST", "/v2/models/{name}/infer", "_v2_infer", doc=openapi.V2_INFER),
    Route("POST", "/v2/models/{name}/versions/{version}/infer", "_v2_infer",
          doc=openapi.V2_INFER),
    Route("GET", "/v2/models/{name}/ready", "_v2_model_ready", doc=openapi.V2_MODEL_READY),
    Route("GET", "/v2/models/{name}/versions/{version}/ready", "_v2_model_ready",
          doc=openapi.V2_MODEL_READY),
    Route("GET", "/v2/models/{name}", "_v2_model_metadata", doc=openapi.V2_MODEL_METADATA),
    Route("GET", "/v2/models/{name}/versions/{version}", "_v2_model_metadata",
          doc=openapi.V2_MODEL_METADATA),
    Route("GET", "/v2/health/live", "_v2_live", public=True, doc=openapi.V2_LIVE),
    Route("GET", "/v2/health/ready", "_v2_ready", public=True, doc=openapi.V2_READY),
    Route("GET", "/v2", "_v2_server_metadata", public=True, doc=openapi.V2_SERVER_METADATA),
)  # fmt: skip


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of ``ROUTES``, built once."""
    return openapi.openapi_document(ROUTES)
