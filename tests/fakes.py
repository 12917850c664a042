"""The stand-ins the tests share, each written once: what it replaces, and why a test that
passes against it would pass against the real thing.

pytest puts tests/ on the path (``pythonpath`` in pyproject.toml): ``from fakes import ...``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import Request

from infergate.protocols.frontend import Frontend

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def asgi(frontend: Frontend) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """``frontend`` as an ASGI app, for starlette's ``TestClient`` or httpx's transport.

    Ray Serve's ingress hands each request to the replica as a starlette ``Request``
    (``serve_app``) and sends back the ``Response`` it gets: so does this, without Ray."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        response = await frontend.handle(Request(scope, receive))
        await response(scope, receive, send)

    return app


class FakeClock:
    """Stands in for ``time.monotonic`` (or ``time.time``) where code takes a ``clock``:
    calling it reads ``now``, which moves only when a test sets it or calls ``advance``.

    It starts at 1000 s rather than 0, so that an age measured from a forgotten zero
    default cannot pass by chance; a test that needs another start passes it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move ``seconds`` on; the new time."""
        self.now += seconds
        return self.now
