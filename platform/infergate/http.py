"""One HTTP error path for every infergate server: the front-end replicas and the
control plane's admin API.

Every failure answers ``{"error": message, "type": kind}`` with the status its
``InfergateError`` class carries; anything unforeseen is logged and answered as a 500
whose body hides internals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from infergate.errors import (
    ClientClosedRequest,
    InfergateError,
    PayloadTooLarge,
    RequestTimeout,
    UnsupportedMediaType,
)

log = logging.getLogger(__name__)
ErrorBody = Callable[[InfergateError], dict[str, Any]]
JSON = "application/json"


def json_bytes(body: Any) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json_bytes(body), status_code=status, headers=headers, media_type=JSON)


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


class SlowUploads:
    """How many requests of one server may still be sending their body after
    ``grace_s``. A client on a working network sends a request of a megabyte well within
    that; a client that dribbles (by accident or on purpose) holds a request slot as long
    as it likes, so past ``limit`` of them the newest is refused at once and the slots stay
    free for everyone else."""

    def __init__(self, limit: int, grace_s: float = 0.5) -> None:
        self.limit = limit
        self.grace_s = grace_s
        self.active = 0


async def read_body(
    request: Request,
    limit: int,
    *,
    timeout_s: float | None = None,
    slow: SlowUploads | None = None,
) -> bytes:
    """Read at most ``limit`` bytes: a huge body is refused before it is all in memory.
    ``timeout_s`` bounds the whole read (408 past it); ``slow`` bounds the reads still
    going after its grace period. A compressed body is refused (415) before it is read:
    no endpoint decompresses, and its bytes would be read as broken text."""
    encoding = request.headers.get("content-encoding")
    if encoding and encoding.strip().lower() != "identity":
        raise UnsupportedMediaType(
            f"content-encoding {encoding!r} is not supported; send the body uncompressed"
        )
    declared = request.headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and _over(declared, limit):
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit} bytes")
    if timeout_s is None:
        return await _collect(request, limit)
    reading = asyncio.ensure_future(_collect(request, limit))
    try:
        grace_s = min(slow.grace_s, timeout_s) if slow is not None else timeout_s
        done, _ = await asyncio.wait({reading}, timeout=grace_s)
        if done:
            return reading.result()
        if slow is None:
            raise _too_slow(timeout_s)
        if slow.active >= slow.limit:
            raise RequestTimeout(
                f"the request body did not arrive within {grace_s:g} s while {slow.active} "
                "other slow uploads are under way; send the body at once"
            )
        slow.active += 1
        try:
            done, _ = await asyncio.wait({reading}, timeout=timeout_s - grace_s)
        finally:
            slow.active -= 1
        if done:
            return reading.result()
        raise _too_slow(timeout_s)
    finally:
        reading.cancel()


def _over(digits: str, limit: int) -> bool:
    """Whether the number ``digits`` is above ``limit``; without converting thousands of
    digits (Python refuses past 4,300)."""
    significant = digits.lstrip("0") or "0"
    return len(significant) > len(str(limit)) or int(significant) > limit


def _too_slow(timeout_s: float) -> RequestTimeout:
    return RequestTimeout(f"the request body did not arrive within {timeout_s:g} s")


async def _collect(request: Request, limit: int) -> bytes:
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
