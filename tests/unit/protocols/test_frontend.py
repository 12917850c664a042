"""Front-end rules that the real stack hits only in a race: a replica without its traffic
table yet, and a client that goes away while its request waits for Triton.

Everything else the handler does is covered over HTTP in tests/e2e/test_stack.py.
"""

import asyncio

import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from fakes import FakeVersion, Recorder, asgi
from infergate.config import FrontendSettings
from infergate.protocols.frontend import Frontend
from infergate.serving.inference import CLIENT_CLOSED_REQUEST
from infergate.serving.routing import ServedModel
from infergate.serving.runtime import drain


def status_only(model: str, version: str, status: int) -> int:
    return status


def test_a_replica_without_its_table_answers_503_not_404():
    starting = Frontend(FrontendSettings(), None, {}, has_table=False)
    client = TestClient(asgi(starting))
    answer = client.post("/v1/models/sentiment/predict", json={"inputs": "hi"})
    assert answer.status_code == 503 and "still starting" in answer.json()["error"]
    assert client.get("/v1/models/sentiment").status_code == 503
    assert client.get("/healthz").status_code == 200
    assert client.head("/healthz").status_code == 200 and client.head("/healthz").content == b""
    assert client.delete("/healthz").status_code == 405
    served = Frontend(FrontendSettings(), None, {})  # a table that serves nothing
    answer = TestClient(asgi(served)).post("/v1/models/sentiment/predict", json={"inputs": "hi"})
    assert answer.status_code == 404 and answer.json()["type"] == "model_not_found"


def test_a_replica_missing_versions_of_its_table_is_not_ready_and_counts_them_by_model():
    recorder = Recorder()
    recorder.labels = []
    recorder.request = lambda model, *rest: recorder.labels.append(model)
    runtime = FakeVersion(stuck=True)
    model = ServedModel("m", "text-classification", (runtime,))  # type: ignore[arg-type]
    frontend = Frontend(FrontendSettings(), None, {"m": model}, telemetry=recorder,
                        loading=frozenset({"b"}), missing=("b v7", "m v2"))  # type: ignore[arg-type]  # fmt: skip
    client = TestClient(asgi(frontend))
    ready = client.get("/readyz")
    assert ready.status_code == 503 and "b v7, m v2" in ready.json()["error"]
    assert not runtime.called.is_set()  # no probe while versions are missing
    assert client.post("/v1/models/b/predict", json={"inputs": "hi"}).status_code == 503
    assert client.post("/v1/models/nope/predict", json={"inputs": "hi"}).status_code == 404
    assert recorder.labels == ["b", "_unknown"]


def test_a_client_that_goes_away_is_recorded_as_499():
    asyncio.run(_client_goes_away())


async def _client_goes_away() -> None:
    runtime, recorder = FakeVersion(stuck=True), Recorder(status_only)
    model = ServedModel("m", "text-classification", (runtime,))  # type: ignore[arg-type]
    frontend = Frontend(FrontendSettings(), None, {"m": model}, telemetry=recorder,
                        monitors=recorder)  # type: ignore[arg-type]  # fmt: skip
    body = b'{"inputs": "hi"}'

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/models/m/predict", "query_string": b"",
             "headers": [(b"content-type", b"application/json")]}  # fmt: skip
    task = asyncio.create_task(frontend.handle(Request(scope, receive)))
    await asyncio.wait_for(runtime.called.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert recorder.requests == [CLIENT_CLOSED_REQUEST]
    assert recorder.monitored == [CLIENT_CLOSED_REQUEST]  # counted, its wait too; no error


def test_a_client_that_goes_away_while_sending_its_body_is_recorded_as_499():
    runtime, recorder = FakeVersion(stuck=True), Recorder(status_only)
    model = ServedModel("m", "text-classification", (runtime,))  # type: ignore[arg-type]
    frontend = Frontend(FrontendSettings(), None, {"m": model}, telemetry=recorder,
                        monitors=recorder)  # type: ignore[arg-type]  # fmt: skip
    messages = iter([
        {"type": "http.request", "body": b'{"inputs": "h', "more_body": True},
        {"type": "http.disconnect"},
    ])  # fmt: skip

    async def receive():
        return next(messages)

    scope = {"type": "http", "method": "POST", "path": "/v1/models/m/predict", "query_string": b"",
             "headers": [(b"content-type", b"application/json")]}  # fmt: skip
    answer = asyncio.run(frontend.handle(Request(scope, receive)))
    assert answer.status_code == CLIENT_CLOSED_REQUEST
    assert recorder.requests == [CLIENT_CLOSED_REQUEST]  # not a 500 of the model's
    assert not runtime.called.is_set()


def test_a_version_leaving_the_table_is_drained_before_it_is_reported_gone():
    async def scenario() -> tuple[bool, bool, float]:
        finishing, stuck = FakeVersion(in_flight=2), FakeVersion(in_flight=1)
        asyncio.get_running_loop().call_later(0.05, finishing.done)
        loop = asyncio.get_running_loop()
        started = loop.time()
        drained = await drain([finishing, FakeVersion()], timeout_s=5)  # type: ignore[list-item]
        waited = loop.time() - started
        return drained, await drain([stuck], timeout_s=0.05), waited  # type: ignore[list-item]

    drained, stuck_drained, waited = asyncio.run(scenario())
    assert drained and 0.04 <= waited < 1 and not stuck_drained


def test_a_request_counts_as_under_way_from_its_first_byte_to_its_answer():
    """A replica switching tables waits for the old front-end's requests: one still reading
    its body has picked no version yet, but it will pick one of the old table's."""

    async def scenario() -> tuple[int, int, int]:
        runtime, recorder = FakeVersion(stuck=True), Recorder(status_only)
        model = ServedModel("m", "text-classification", (runtime,))  # type: ignore[arg-type]
        frontend = Frontend(FrontendSettings(), None, {"m": model}, telemetry=recorder,
                            monitors=recorder)  # type: ignore[arg-type]  # fmt: skip
        body_sent = asyncio.Event()

        async def receive():
            await body_sent.wait()
            return {"type": "http.request", "body": b'{"inputs": "hi"}', "more_body": False}

        headers = [(b"content-type", b"application/json")]
        scope = {"type": "http", "method": "POST", "path": "/v1/models/m/predict",
                 "query_string": b"", "headers": headers}  # fmt: skip
        task = asyncio.create_task(frontend.handle(Request(scope, receive)))
        await asyncio.sleep(0.01)
        reading = frontend.in_flight
        body_sent.set()
        await asyncio.wait_for(runtime.called.wait(), 5)
        inferring = frontend.in_flight
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return reading, inferring, frontend.in_flight

    assert asyncio.run(scenario()) == (1, 1, 0)
