"""API keys, rate limits, load shedding and slow uploads, through a Frontend's HTTP
handling with a runtime that answers at once (the e2e tests do the same on the real
ingress)."""

import asyncio

from starlette.requests import Request
from starlette.testclient import TestClient

from fakes import FakeVersion, Recorder, asgi
from infergate.config import FrontendSettings
from infergate.errors import Overloaded
from infergate.http import SlowUploads
from infergate.protocols.frontend import Frontend
from infergate.serving.access import Access, KeyEntry, KeyFile, digest, new_key, write_keys
from infergate.serving.routing import ServedModel


def model_and_status(model: str, version: str, status: int) -> tuple[str, int]:
    return model, status


def served(*runtimes) -> dict[str, ServedModel]:
    return {r.served.name: ServedModel(r.served.name, "text-classification", (r,))
            for r in runtimes}  # fmt: skip


def with_keys(tmp_path, recorder, **limits):
    scoped, anything = new_key(), new_key()
    path = tmp_path / "keys.yaml"
    write_keys(path, KeyFile(keys=[
        KeyEntry(id="search", sha256=digest(scoped), models=("embed",), **limits),
        KeyEntry(id="ops", sha256=digest(anything), models=("*",)),
    ]))  # fmt: skip
    frontend = Frontend(
        FrontendSettings(), None, served(FakeVersion("embed"), FakeVersion("sentiment")),  # type: ignore[arg-type]
        telemetry=recorder, monitors=recorder, access=Access(path),  # type: ignore[arg-type]
    )  # fmt: skip
    return TestClient(asgi(frontend)), scoped, anything


def test_inference_and_model_listing_want_a_key_probes_do_not(tmp_path):
    recorder = Recorder(model_and_status)
    client, scoped, _ = with_keys(tmp_path, recorder)
    refused = client.post("/v1/models/embed/predict", json={"inputs": "hi"})
    assert refused.status_code == 401 and refused.json()["type"] == "unauthorized"
    assert refused.headers["www-authenticate"] == "Bearer"
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models/embed").status_code == 401
    for probe in ("/healthz", "/openapi.json"):
        assert client.get(probe).status_code == 200, probe
    wrong = client.get("/v1/models", headers={"authorization": f"Bearer {new_key()}"})
    assert wrong.status_code == 401 and "not valid" in wrong.json()["error"]
    ok = client.post("/v1/models/embed/predict", json={"inputs": "hi"},
                     headers={"authorization": f"Bearer {scoped}"})  # fmt: skip
    assert ok.status_code == 200 and ok.json()["outputs"][0]["label"] == "pos"
    assert recorder.callers == [("search", "embed", 200)]  # the id, never the key


def test_a_key_sees_and_calls_only_its_models(tmp_path, caplog):
    caplog.set_level("INFO", logger="infergate.serving.inference")
    recorder = Recorder(model_and_status)
    client, scoped, anything = with_keys(tmp_path, recorder)
    mine = {"x-api-key": scoped}
    listed = client.get("/v1/models", headers=mine).json()["models"]
    assert [m["name"] for m in listed] == ["embed"]
    forbidden = client.post("/v1/models/sentiment/predict", json={"inputs": "hi"}, headers=mine)
    assert forbidden.status_code == 403 and forbidden.json()["type"] == "forbidden"
    assert "'search' may not call model 'sentiment'" in forbidden.json()["error"]
    assert client.get("/v1/models/sentiment", headers=mine).status_code == 403
    everything = client.get("/v1/models", headers={"x-api-key": anything}).json()["models"]
    assert sorted(m["name"] for m in everything) == ["embed", "sentiment"]
    assert recorder.callers == [("search", "sentiment", 403)]
    assert recorder.monitored == []  # no version was asked: nothing for the canary
    assert "key search refused on model sentiment: 403" in caplog.text
    assert scoped not in caplog.text


def test_a_key_over_its_rate_gets_429_with_retry_after(tmp_path):
    recorder = Recorder(model_and_status)
    client, scoped, _ = with_keys(tmp_path, recorder, requests_per_s=3)
    statuses = []
    for _ in range(6):
        answer = client.post("/v1/models/embed/predict", json={"inputs": "hi"},
                             headers={"x-api-key": scoped})  # fmt: skip
        statuses.append(answer.status_code)
    assert statuses[:3] == [200, 200, 200] and 429 in statuses[3:]
    limited = client.post("/v1/models/embed/predict", json={"inputs": "hi"},
                          headers={"x-api-key": scoped})  # fmt: skip
    assert limited.json()["type"] == "rate_limited"
    assert int(limited.headers["retry-after"]) >= 1
    assert ("search", "embed", 429) in recorder.callers
    assert 429 not in recorder.monitored


def test_a_request_shed_for_load_is_a_429_the_canary_does_not_count():
    recorder = Recorder(model_and_status)
    shedding = FakeVersion("m", error=Overloaded("3000 texts already wait", retry_after_s=1))
    frontend = Frontend(FrontendSettings(), None, served(shedding),  # type: ignore[arg-type]
                        telemetry=recorder, monitors=recorder)  # type: ignore[arg-type]  # fmt: skip
    answer = TestClient(asgi(frontend)).post("/v1/models/m/predict", json={"inputs": "hi"})
    assert answer.status_code == 429 and answer.headers["retry-after"] == "1"
    assert recorder.requests == [("m", 429)]
    assert recorder.monitored == []  # neither an error nor a latency of the version's


def test_a_stalled_upload_gets_a_408_and_past_the_slow_budget_at_once():
    asyncio.run(_stalled_uploads())


async def _stalled_uploads() -> None:
    recorder = Recorder(model_and_status)
    settings = FrontendSettings(body_timeout_s=0.5)
    frontend = Frontend(settings, None, served(FakeVersion("m")), telemetry=recorder,  # type: ignore[arg-type]
                        monitors=recorder, uploads=SlowUploads(1, grace_s=0.05))  # type: ignore[arg-type]  # fmt: skip
    scope = {"type": "http", "method": "POST", "path": "/v1/models/m/predict", "query_string": b"",
             "headers": [(b"content-type", b"application/json")]}  # fmt: skip

    async def dribble():  # the first bytes, then nothing
        if not hasattr(dribble, "sent"):
            dribble.sent = True  # type: ignore[attr-defined]
            return {"type": "http.request", "body": b'{"inp', "more_body": True}
        await asyncio.sleep(3600)

    loop = asyncio.get_running_loop()
    started = loop.time()
    first = asyncio.create_task(frontend.handle(Request(scope, dribble)))
    await asyncio.sleep(0.2)  # past the grace: it holds the one slow slot

    async def never():
        await asyncio.sleep(3600)

    second = await frontend.handle(Request(scope, never))
    assert second.status_code == 408 and loop.time() - started < 0.4
    assert b"other slow uploads" in second.body
    answer = await first
    assert answer.status_code == 408 and 0.45 < loop.time() - started < 1.5
    assert answer.headers["connection"] == "close"
    assert frontend.uploads.active == 0
    assert recorder.requests == [("m", 408), ("m", 408)]
