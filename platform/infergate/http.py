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
)

log = logging.getLogger(__name__)
ErrorBody = Callable[[InfergateError], dict[str, Any]]
JSON = "application/json"


def json_body(body: Any) -> bytes:
    """``body`` as JSON bytes (numpy arrays and scalars as JSON numbers)."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json_body(body), status_code=status, headers=headers, media_type=JSON)


def request_path(request: Request) -> str:
    """``request.url.path`` without building the whole URL (host, scheme, query), which
    costs a few microseconds on every request: the same escaping Starlette's ``URL``
    applies to the scope's path."""
    return request.scope["path"].replace("?", "%3F").replace("#", "%23").replace("\\", "%5C")


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
    going after its grace period."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit} bytes")
    if timeout_s is None:
        return await _collect(request, limit)
    # Read in this task, with timers that stop the read when it runs out of time: nearly
    # every body is all there at once, and a task of its own with ``asyncio.wait`` around
    # it took about 6 % of the request path's CPU in a profile of a replica's path.
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    grace_s = min(slow.grace_s, timeout_s) if slow is not None else timeout_s
    refused: list[RequestTimeout] = []
    timers: list[asyncio.TimerHandle] = []
    counted = False

    def stop(error: RequestTimeout) -> None:
        refused.append(error)
        task.cancel()

    def past_grace() -> None:
        nonlocal counted
        if slow is None:
            stop(_too_slow(timeout_s))
        elif slow.active >= slow.limit:
            stop(
                RequestTimeout(
                    f"the request body did not arrive within {grace_s:g} s while "
                    f"{slow.active} other slow uploads are under way; send the body at once"
                )
            )
        else:
            slow.active += 1
            counted = True
            timers.append(loop.call_later(timeout_s - grace_s, stop, _too_slow(timeout_s)))

    timers.append(loop.call_later(grace_s, past_grace))
    try:
        return await _collect(request, limit)
    except asyncio.CancelledError:
        if not refused:
            raise
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+: the cancel was ours
        if uncancel is not None:
            uncancel()
        raise refused[0] from None
    finally:
        for timer in timers:
            timer.cancel()
        if counted and slow is not None:
            slow.active -= 1


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
