"""The handlers of Text Embeddings Inference's routes under ``/tei/{name}``, as a part of
``Frontend`` (``infergate.protocols.frontend``, whose route table names them): the
inference routes go through ``Frontend.serve_inference`` like every protocol's, with
``infergate.protocols.tei``'s parsers and ``tei_answers``' answers; tokenize, decode,
info, health and metrics answer without inference."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from infergate import tasks
from infergate.http import json_response
from infergate.protocols import tei, tei_answers, tei_bodies
from infergate.protocols.tei_metrics import CONTENT_TYPE, model_metrics
from infergate.protocols.wire import Parse
from infergate.serving.access import OPEN, Caller
from infergate.serving.runtime import ModelRuntime

if TYPE_CHECKING:
    from infergate.config import FrontendSettings
    from infergate.protocols.wire import Check, Limits, Render
    from infergate.serving.access import Access
    from infergate.serving.inference import InferencePath
    from infergate.serving.routing import ServedModel


class TeiHandlers:
    """TEI's routes of one model's base URL; ``Frontend`` holds what they use."""

    if TYPE_CHECKING:  # Frontend's
        settings: FrontendSettings
        models: dict[str, ServedModel]
        limits: Limits
        access: Access
        path: InferencePath

        async def serve_inference(
            self, request: Request, name: str | None, parse: Parse, render: Render,
            version: str | None = None, check: Check | None = None,
        ) -> Response: ...  # fmt: skip

        def model_for(self, request: Request, name: str) -> ServedModel: ...

        async def _json_body(self, request: Request) -> bytes: ...

    async def _tei_root(self, request: Request, name: str) -> Response:
        """TEI's ``POST /``: the route of the model's task."""
        served = self.models.get(name)
        route = tasks.get(served.task).tei_route if served is not None else None
        return await self._tei(request, name, route or "embed", tei.ROOT_PARSERS)

    async def _tei_embed(self, request: Request, name: str) -> Response:
        return await self._tei(request, name, "embed")

    async def _tei_embed_sparse(self, request: Request, name: str) -> Response:
        return await self._tei(request, name, "embed_sparse")

    async def _tei_predict(self, request: Request, name: str) -> Response:
        return await self._tei(request, name, "predict")

    async def _tei_rerank(self, request: Request, name: str) -> Response:
        return await self._tei(request, name, "rerank")

    async def _tei_similarity(self, request: Request, name: str) -> Response:
        return await self._tei(request, name, "similarity")

    async def _tei_embed_all(self, request: Request, name: str) -> Response:
        """Refused once the body and the model are checked (``refuse_embed_all``)."""
        return await self.serve_inference(
            request, name, tei.parse_embed_all, tei_answers.render,
            check=tei_answers.refuse_embed_all,
        )  # fmt: skip

    async def _tei(
        self, request: Request, name: str, route: str, parsers: Mapping[str, Parse] = tei.PARSERS
    ) -> Response:
        return await self.serve_inference(
            request, name, parsers[route], tei_answers.render,
            check=tei_answers.refuse_unless(route),
        )  # fmt: skip

    async def _tei_tokenize(self, request: Request, name: str) -> Response:
        runtime = self._tei_version(request, name)
        asked = tei_bodies.TokenizeBody.parse(await self._json_body(request), self.limits)
        texts = asked.inputs if isinstance(asked.inputs, list) else [asked.inputs]
        self.access.admit(_caller(request), len(texts))
        tokens = tei_answers.tokenize(runtime, texts, asked.add_special_tokens, asked.prompt_name)
        return json_response(tokens)

    async def _tei_decode(self, request: Request, name: str) -> Response:
        runtime = self._tei_version(request, name)
        asked = tei_bodies.DecodeBody.parse(await self._json_body(request), self.limits)
        self.access.admit(_caller(request), 1)
        texts = tei_answers.decode(runtime.tokenizer, asked.ids, asked.skip_special_tokens)
        return json_response(texts)

    async def _tei_info(self, request: Request, name: str) -> Response:
        model = self.model_for(request, name)
        return json_response(tei_answers.info(model, self._tei_version(request, name), self.limits))

    async def _tei_health(self, request: Request, name: str) -> Response:
        """TEI's ``GET /health``: 200 (no body) when every served version of the model
        answers a request, else 503 in TEI's error shape (``unhealthy``)."""
        await self.path.model_ready(self.model_for(request, name), None)
        return Response(status_code=200)

    async def _tei_metrics(self, request: Request, name: str) -> Response:
        """TEI's ``GET /metrics``: the model's series, read from the platform's
        Prometheus (``infergate.protocols.tei_metrics``)."""
        model = self.model_for(request, name)
        settings = self.settings
        text = await model_metrics(
            settings.metrics_federate_url, model.name, settings.triton_timeout_s
        )
        return Response(text, media_type=CONTENT_TYPE)

    def _tei_version(self, request: Request, name: str) -> ModelRuntime:
        """The version a request to model ``name`` would reach (tokenize, decode, info)."""
        model = self.model_for(request, name)
        headers = request.headers
        return model.pick(headers.get("x-routing-key"), headers.get("x-model-version"))


def _caller(request: Request) -> Caller:
    return getattr(request.state, "caller", OPEN)
