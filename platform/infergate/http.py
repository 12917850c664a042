"""One HTTP error path for every infergate server: the front-end replicas and the
control plane's admin API.

Every failure answers ``{"error": message, "type": kind}`` with the status its
``InfergateError`` class carries; anything unforeseen is logged and answered as a 500
whose body hides internals.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from infergate.errors import ClientClosedRequest, InfergateError, PayloadTooLarge

log = logging.getLogger(__name__)
ErrorBody = Callable[[InfergateError], dict[str, Any]]
JSON = "application/json"


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    content = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(content, status_code=status, headers=headers, media_type=JSON)


def error_response(error: InfergateError, body: ErrorBody | None = None) -> Response:
    """The error's status and headers; its body ``error.to_body()``, or in the shape
    another protocol wants (``body``)."""
    content = body(error) if body is not None else error.to_body()
    return json_response(content, status=error.status, headers=error.headers() or None)


async def answer(
    handle: Callable[[], Awaitable[Response]], what: str, body: ErrorBody | None = None
) -> Response:
    """``handle()``'s response, or the error response of whatever it raised; ``what``
    names the request in the log (``POST /predict``), ``body`` shapes error bodies."""
    try:
        return await handle()
    except InfergateError as error:
        if error.status >= 500:
            log.warning("%s failed: %s", what, error)
        return error_response(error, body)
    except Exception:
        log.exception("unhandled error on %s", what)
        return error_response(InfergateError("internal error"), body)


async def read_body(request: Request, limit: int) -> bytes:
    """Read at most ``limit`` bytes: a huge body is refused before it is all in memory."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit} bytes")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect as exc:
        raise ClientClosedRequest("the client went away before sending the whole body") from exc
    return b"".join(chunks)
