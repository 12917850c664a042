"""The stand-ins the tests share, each written once: what it replaces, and why a test that
passes against it would pass against the real thing.

pytest puts tests/ on the path (``pythonpath`` in pyproject.toml): ``from fakes import ...``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import Request

from infergate.protocols.frontend import Frontend
from infergate.serving.runtime import ModelRuntime, Prediction

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


def _model_version_status(model: str, version: str, status: int) -> object:
    return model, version, status


class Recorder:
    """Stands in for a replica's ``Telemetry`` (``infergate.observe.telemetry``) and its
    ``Monitors`` at once: it has every method of both, and keeps in order what each was
    told where the real ones publish it to Ray. A test reads exactly what the front-end
    reported, with nothing counted or aggregated on the way.

    ``requests`` holds ``keep(model, version, status)`` of each request, so that a test
    keeps the fields it is about (the status alone, say) and compares them whole."""

    def __init__(self, keep: Callable[[str, str, int], object] = _model_version_status) -> None:
        self.keep = keep
        self.requests: list[Any] = []
        self.callers: list[tuple[str, str, int]] = []
        self.drifts: list[dict[tuple[str, str], float]] = []
        self.weights: list[tuple[str, str, str, float]] = []
        self.monitored: list[int] = []

    def request(
        self, model: str, version: str, status: int, prediction: Prediction | None, total_s: float
    ) -> None:
        self.requests.append(self.keep(model, version, status))

    def caller(self, key: str, model: str, status: int) -> None:
        self.callers.append((key, model, status))

    def drift(self, model: str, version: str, scores: dict[tuple[str, str], float]) -> None:
        self.drifts.append(dict(scores))

    def weight(self, model: str, version: str, role: str, weight: float) -> None:
        self.weights.append((model, version, role, weight))

    def flush(self) -> None:
        pass

    def record(
        self, runtime: ModelRuntime, status: int, seconds: float, prediction: Prediction | None
    ) -> None:
        self.monitored.append(status)
