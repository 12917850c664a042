"""Fuzzing the admin API: any method, path, headers and body a client can send get an
answer below 500 in the one JSON error shape, and nothing escapes as a traceback.

Requests go straight into the ASGI app, so header values can be any bytes an HTTP server
hands on (Starlette decodes them as Latin-1). Commands run the real rollout manager over
a registry held in memory, so their bodies meet the checks they meet in production.
"""

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from urllib.parse import quote

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infergate.control.admin import AdminApi
from infergate.control.rollouts import Rollouts
from infergate.control.webhooks import DELIVERY_ID, SIGNATURE, TIMESTAMP, sign
from infergate.errors import ModelNotFound
from infergate.registry import RegisteredModel

SECRET, TOKEN, NOW = "s", "t0k", 1000.0
FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class MemoryRegistry:
    """The part of ``Registry`` that ``Rollouts`` uses, with its errors for unknown names."""

    def __init__(self) -> None:
        model = RegisteredModel("m", "text-classification", {"champion": "1"}, {})
        self._models = {"m": model}
        self._versions = {"1", "2", "3"}

    def models(self) -> list[RegisteredModel]:
        return list(self._models.values())

    def model(self, name: str) -> RegisteredModel:
        if name not in self._models:
            raise ModelNotFound(f"model {name!r} is not in the registry")
        return self._models[name]

    def version_source(self, name: str, version: str) -> str:
        return f"runs:/run/{name}/{version}"

    def version_task(self, name: str, version: str) -> str:
        if version not in self._versions:
            raise ModelNotFound(f"model {name!r} has no version {version!r}")
        return self.model(name).task

    def set_model_tags(self, name: str, tags: dict[str, str]) -> None:
        self.model(name).tags.update(tags)

    def delete_model_tags(self, name: str, keys: list[str]) -> None:
        for key in keys:
            self.model(name).tags.pop(key, None)

    def set_version_tags(self, name: str, version: str, tags: dict[str, str]) -> None:
        self.model(name)

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self.model(name).aliases[alias] = version

    def delete_alias(self, name: str, alias: str) -> None:
        self.model(name).aliases.pop(alias, None)


def admin_app() -> AdminApi:
    """A fresh API per example, so that one example's rollout never shapes the next."""
    rollouts = Rollouts(MemoryRegistry(), stats=dict, clock=lambda: NOW)
    return AdminApi(rollouts, lambda: None, token=TOKEN, webhook_secret=SECRET,
                    clock=lambda: NOW)  # fmt: skip


async def call(
    app: AdminApi, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes
) -> tuple[int, bytes]:
    """One request through the ASGI app, as an HTTP server would pass it on."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http",
        "method": method, "path": path, "raw_path": quote(path).encode(), "query_string": b"",
        "root_path": "", "headers": headers, "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8104),
    }  # fmt: skip
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app.app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


class Tracebacks(logging.Handler):
    """Log records that carry an exception: what an operator would see as a traceback.
    Only the test's thread's, where the admin API runs and logs: a thread another test
    left behind (a payload log writing its last file into a removed folder) may log a
    traceback of its own at any time, and failed this test now and then in busy runs. Nor
    asyncio's "exception was never retrieved", which it logs in whatever thread collects
    another test's finished task (each request here runs to its end on this loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.thread = threading.get_ident()

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.thread == self.thread and record.name != "asyncio":
            self.records.append(record)


class Client:
    """Sends each request to a fresh admin API on one event loop, and checks the answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tracebacks: Tracebacks) -> None:
        self.loop, self.tracebacks = loop, tracebacks

    def check(
        self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> None:
        """Never a 5xx nor a traceback; every 4xx in the shape ``{"error", "type"}``."""
        self.tracebacks.records.clear()
        status, content = self.loop.run_until_complete(
            call(admin_app(), method, path, headers, body)
        )
        assert status < 500, content
        assert not self.tracebacks.records, self.tracebacks.records[0].getMessage()
        assert b"Traceback" not in content
        answer = orjson.loads(content)
        if status >= 400:
            assert set(answer) == {"error", "type"}, answer
            assert isinstance(answer["error"], str) and isinstance(answer["type"], str)


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    loop, tracebacks = asyncio.new_event_loop(), Tracebacks()
    logging.getLogger().addHandler(tracebacks)
    yield Client(loop, tracebacks)
    logging.getLogger().removeHandler(tracebacks)
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()


# -- strategies ----------------------------------------------------------------------------

# What an HTTP/1.1 server passes on: no CR, LF or NUL, no surrounding blanks. Not empty:
# an empty header is a missing one, which webhook_headers leaves out often enough.
header_bytes = (
    st.lists(st.integers(1, 255).filter(lambda b: b not in b"\r\n"), min_size=1, max_size=64)
    .map(lambda b: bytes(b).strip(b" \t"))
    .filter(bool)
)
# No lone surrogates: servers decode paths with errors="replace", and orjson refuses them
# in a body (a 400 before anything else looks at it).
name_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | name_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(name_text, inner, max_size=4),
    max_leaves=10,
)
command_fields = st.dictionaries(
    st.sampled_from(["version", "weight", "mode", "reason"]) | name_text,
    json_values | st.sampled_from(["1", "2", "3", "auto", "manual", 0, 10, 100]),
    max_size=4,
)
event_data = st.fixed_dictionaries({"name": st.just("m") | json_values, "version": json_values})
events = st.fixed_dictionaries(
    {
        "entity": st.sampled_from(["model_version", "model_version_alias"]) | json_values,
        "action": st.sampled_from(["created", "deleted"]) | json_values,
        "data": event_data | json_values,
    }
)


def dumps(value: object) -> bytes:
    """JSON as any client may write it: integers past 64 bits, Infinity."""
    return json.dumps(value).encode()


bodies = st.binary(max_size=256) | st.one_of(json_values, command_fields, events).map(dumps)
model_names = st.just("m") | name_text.filter(lambda n: n and "/" not in n)
paths = st.one_of(
    st.just("/admin/webhooks/mlflow"),
    st.builds(
        "/admin/models/{}/{}".format,
        model_names,
        st.sampled_from(
            ["rollout", "canary", "canary/weight", "canary/promote", "canary/rollback"]
        ),
    ),
    name_text.map(lambda p: "/" + p),
)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"])
authorizations = st.sampled_from([b"Bearer " + TOKEN.encode(), b"Bearer nope", b""]) | (
    header_bytes.map(lambda b: b"Bearer " + b)
)
unix_times = st.sampled_from([b"1000", b"999", b"0", b"-1", b"1" + b"0" * 400, b"1e3"])
timestamps = unix_times | header_bytes
other_headers = st.lists(
    st.tuples(
        st.sampled_from(
            [b"content-type", b"content-length", b"x-api-key", b"accept", b"transfer-encoding"]
        ),
        header_bytes | st.integers(0, 10**9).map(lambda n: str(n).encode()),
    ),
    max_size=3,
)


@st.composite
def webhook_headers(
    draw: st.DrawFn, body: bytes, *, complete: bool = True
) -> list[tuple[bytes, bytes]]:
    """Delivery headers (``complete``: all three, else some), the signature right or not."""
    delivery_id = draw(st.sampled_from([b"d1", b"d2"]) | header_bytes)
    timestamp = draw(st.just(b"1000") | timestamps)
    signature = sign(SECRET, delivery_id.decode("latin-1"), timestamp.decode("latin-1"), body)
    headers = [
        (DELIVERY_ID.encode(), delivery_id),
        (TIMESTAMP.encode(), timestamp),
        (SIGNATURE.encode(), draw(st.just(signature.encode()) | header_bytes)),
    ]
    if complete:
        return headers
    return draw(st.lists(st.sampled_from(headers), unique=True, max_size=3))


@given(data=st.data())
@FUZZ
def test_webhook_deliveries(client, data):
    body = data.draw(bodies, "body")
    headers = data.draw(webhook_headers(body), "headers") + data.draw(other_headers, "other")
    client.check("POST", "/admin/webhooks/mlflow", headers, body)


@given(data=st.data())
@FUZZ
def test_any_request(client, data):
    method, path, body = data.draw(methods, "method"), data.draw(paths, "path"), data.draw(bodies)
    headers = [(b"authorization", data.draw(authorizations, "authorization"))]
    headers += data.draw(other_headers, "other")
    if path == "/admin/webhooks/mlflow":
        headers += data.draw(webhook_headers(body, complete=False), "delivery")
    client.check(method, path, headers, body)


@given(path=paths, fields=command_fields, body=bodies)
@FUZZ
def test_commands_with_the_token(client, path, fields, body):
    method = "GET" if path.endswith("/rollout") else "POST"
    headers = [(b"authorization", b"Bearer " + TOKEN.encode())]
    client.check(method, path, headers, dumps(fields))
    client.check(method, path, headers, body)
