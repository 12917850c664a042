"""Paths to handlers for the front-end: ``/v2/models/{name}/versions/{version}/infer``
style patterns, matched in order, a 405 naming the allowed methods where the path is
known but the method is not. Pure: the front-end looks its handlers up by name."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from infergate.errors import InfergateError, MethodNotAllowed, RouteNotFound
from infergate.http import ErrorBody

_PARAMETER = re.compile(r"\{(\w+)\}")


def _default_error_body(error: InfergateError) -> dict[str, Any]:
    return error.to_body()


@dataclass(frozen=True)
class Route:
    """``handler`` names a method of the front-end, called with the path's parameters;
    ``error_body`` shapes the errors of the route's protocol; ``public`` routes (probes,
    the API's description) answer without an API key; ``doc`` is the route's operation in
    the OpenAPI document (``infergate.protocols.openapi``), None to leave it out."""

    method: str
    pattern: str
    handler: str
    error_body: ErrorBody = _default_error_body
    public: bool = False
    doc: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = _PARAMETER.split(self.pattern)
        # split() alternates literal text and parameter names.
        source = "".join(
            re.escape(part) if index % 2 == 0 else f"(?P<{part}>[^/]+)"
            for index, part in enumerate(parts)
        )
        object.__setattr__(self, "regex", re.compile(source))

    @property
    def parameters(self) -> list[str]:
        """The path's parameters, in order."""
        return _PARAMETER.findall(self.pattern)

    def takes(self, method: str) -> bool:
        # HEAD is a GET without its body (uvicorn leaves the body out): `curl -I`, probes.
        return method == self.method or (method == "HEAD" and self.method == "GET")


class Routes:
    def __init__(self, *routes: Route) -> None:
        self.routes = routes

    def __iter__(self) -> Iterator[Route]:
        return iter(self.routes)

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route and its path parameters; RouteNotFound or MethodNotAllowed."""
        path = path.rstrip("/") or "/"
        allowed: list[str] = []
        for route in self.routes:
            found = route.regex.fullmatch(path)
            if found is None:
                continue
            if route.takes(method):
                return route, found.groupdict()
            allowed.append(route.method)
        if allowed:
            if "GET" in allowed:
                allowed.append("HEAD")
            raise MethodNotAllowed(
                f"method {method} is not allowed on {path}; use {' or '.join(allowed)}",
                ", ".join(dict.fromkeys(allowed)),
            )
        raise RouteNotFound(f"no route {method} {path}; see GET /openapi.json")
