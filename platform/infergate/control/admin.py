"""The control plane's HTTP API: MLflow webhooks and the rollout commands of the CLI.

Runs inside the ``infergate up`` supervisor, next to the control plane it drives.
Commands require ``Authorization: Bearer <admin token>`` when a token is configured;
webhooks are authenticated by their HMAC signature instead.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infergate.config import AdminSettings
from infergate.control.rollouts import Rollouts
from infergate.control.webhooks import SeenDeliveries, verify
from infergate.errors import (
    DeliveryUnderWay,
    InfergateError,
    InvalidInput,
    MalformedBody,
    MethodNotAllowed,
    RouteNotFound,
    StackError,
    Unauthorized,
)
from infergate.http import answer, error_response, json_response, read_body

log = logging.getLogger(__name__)
ALIAS_EVENTS = {"model_version_alias.created", "model_version_alias.deleted"}
# MLflow's webhook payloads and the commands' bodies are a few hundred bytes; a larger body
# is refused before it is read whole, and before its signature is computed over it.
MAX_BODY_BYTES = 64 * 1024


def check_exposure(settings: AdminSettings) -> None:
    """Refuse to serve the admin API beyond this machine without a token: its commands
    promote and roll back what every client is served."""
    if settings.token or _is_loopback(settings.host):
        return
    raise StackError(
        f"the admin API would listen on {settings.host} without a token; set "
        "INFERGATE_ADMIN__TOKEN (canary commands then need 'Authorization: Bearer TOKEN'), "
        "or keep INFERGATE_ADMIN__HOST on 127.0.0.1"
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def _fields(body: bytes, allowed: dict[str, type | tuple[type, ...]]) -> dict[str, Any]:
    try:
        data = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as exc:
        raise MalformedBody(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput("body must be a JSON object")
    for key, value in data.items():
        expected = allowed.get(key)
        if expected is None:
            raise InvalidInput(f"unknown field {key!r}; allowed: {sorted(allowed)}")
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is int):
            raise InvalidInput(f"field {key!r} has the wrong type")
    return data


async def _routing_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405, in the one JSON shape of every other error."""
    assert isinstance(exc, HTTPException)
    path = f"{request.method} {request.url.path}"
    if exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        return error_response(MethodNotAllowed(f"method not allowed: {path}", allow))
    return error_response(RouteNotFound(f"no route {path}"))


class AdminApi:
    def __init__(
        self,
        rollouts: Rollouts,
        reconcile: Callable[[], None],
        *,
        request_reconcile: Callable[[], None] | None = None,
        token: str | None,
        webhook_secret: str,
        lock: threading.RLock | None = None,
        clock: Callable[[], float] = time.time,
        deliveries: Path | None = None,
    ) -> None:
        """``deliveries``: the file that keeps the handled webhook deliveries' ids across
        restarts (none: kept in memory only)."""
        self.rollouts = rollouts
        self.reconcile = reconcile
        # Webhooks only ask for a reconcile and answer at once: MLflow times deliveries
        # out and retries them, and a reconcile can take seconds (Triton loads a model).
        self.request_reconcile = request_reconcile or reconcile
        self.token = token
        self.webhook_secret = webhook_secret
        self.clock = clock
        self.seen = SeenDeliveries(journal=deliveries, clock=clock)
        # Shared with the control loop: one registry writer at a time.
        self._lock = lock or threading.RLock()
        model = "/admin/models/{name}"
        routes = [
            ("/admin/webhooks/mlflow", self._wrap(self.webhook, auth=False, locked=False), "POST"),
            (model + "/rollout", self._wrap(self.status), "GET"),
            (model + "/canary", self._wrap(self.start), "POST"),
            (model + "/canary/weight", self._wrap(self.weight), "POST"),
            (model + "/canary/promote", self._wrap(self.promote), "POST"),
            (model + "/canary/rollback", self._wrap(self.rollback), "POST"),
        ]
        self.app = Starlette(
            routes=[Route(p, e, methods=[m]) for p, e, m in routes],
            exception_handlers={HTTPException: _routing_error},
        )

    def _wrap(
        self, handler: Callable[..., Any], *, auth: bool = True, locked: bool = True
    ) -> Callable[..., Any]:
        async def endpoint(request: Request) -> Response:
            async def respond() -> Response:
                if auth:
                    self._authorize(request)
                body = await read_body(request, MAX_BODY_BYTES)
                # Registry calls block: run them off the event loop, one command at a time.
                if locked:
                    result = await run_in_threadpool(self._locked, handler, request, body)
                else:
                    result = await run_in_threadpool(handler, request, body)
                return json_response(result)

            return await answer(respond, f"admin {request.method} {request.url.path}")

        return endpoint

    def _locked(self, handler: Callable[..., Any], request: Request, body: bytes) -> Any:
        with self._lock:
            return handler(request, body)

    def _authorize(self, request: Request) -> None:
        if not self.token:
            return
        # The header's own bytes (Starlette decodes them as Latin-1): compare_digest refuses
        # non-ASCII text.
        given = request.headers.get("authorization", "").encode("latin-1")
        if not hmac.compare_digest(given, f"Bearer {self.token}".encode()):
            raise Unauthorized("a valid admin token is required (Authorization: Bearer ...)")

    # -- handlers (run in a worker thread, under the lock) --------------------------------

    def webhook(self, request: Request, body: bytes) -> dict[str, Any]:
        event = verify(self.webhook_secret, request.headers, body, self.clock())
        if not self.seen.first_time(event.delivery_id):
            if self.seen.under_way(event.delivery_id):
                raise DeliveryUnderWay(
                    f"delivery {event.delivery_id} is still being handled; retry later"
                )
            return {"status": "duplicate", "delivery_id": event.delivery_id}
        log.info("webhook %s %s", event.name, event.data)
        try:
            if event.name == "model_version.created":
                with self._lock:
                    self.rollouts.on_version_created(
                        str(event.data.get("name")), str(event.data.get("version"))
                    )
            if event.name in ALIAS_EVENTS or event.name == "model_version.created":
                self.request_reconcile()
        except BaseException as exc:
            # MLflow retries a 5xx (so the delivery is not marked as seen), not a 4xx:
            # the log is the only place that tells of one.
            self.seen.forget(event.delivery_id)
            log.warning("webhook %s not acted on: %s", event.name, exc)
            raise
        self.seen.handled(event.delivery_id)
        return {"status": "accepted", "event": event.name}

    def status(self, request: Request, body: bytes) -> dict[str, Any]:
        return self.rollouts.status(request.path_params["name"]).to_dict()

    def start(self, request: Request, body: bytes) -> dict[str, Any]:
        fields: dict[str, type | tuple[type, ...]] = {
            "version": (str, int), "weight": int, "mode": str, "shadow": bool
        }  # fmt: skip
        data = _fields(body, fields)
        if "version" not in data:
            raise InvalidInput("field 'version' is required")
        mode = data.get("mode", "auto")
        if mode not in ("auto", "manual"):
            raise InvalidInput(f"mode must be 'auto' or 'manual', got {mode!r}")
        status = self.rollouts.start(
            request.path_params["name"], str(data["version"]), weight=data.get("weight"),
            mode=mode, shadow=data.get("shadow", True),
        )  # fmt: skip
        self.reconcile()
        return status.to_dict()

    def weight(self, request: Request, body: bytes) -> dict[str, Any]:
        data = _fields(body, {"weight": int})
        if "weight" not in data:
            raise InvalidInput("field 'weight' is required")
        status = self.rollouts.set_weight(request.path_params["name"], data["weight"])
        self.reconcile()
        return status.to_dict()

    def promote(self, request: Request, body: bytes) -> dict[str, Any]:
        status = self.rollouts.promote(request.path_params["name"])
        self.reconcile()
        return status.to_dict()

    def rollback(self, request: Request, body: bytes) -> dict[str, Any]:
        data = _fields(body, {"reason": str})
        status = self.rollouts.rollback(
            request.path_params["name"], data.get("reason") or "rolled back by hand"
        )
        self.reconcile()
        return status.to_dict()


class AdminServer:
    """Uvicorn in a daemon thread; stopped with the supervisor."""

    def __init__(self, app: Starlette, host: str, port: int) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="infergate-admin", daemon=True)

    def start(self, timeout_s: float = 10.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise InfergateError("the admin API did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
