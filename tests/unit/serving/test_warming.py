"""A replica's side of loading on demand: a request for a served version Triton does not
hold waits for one load however many requests ask, hot versions are not held up, and a
load that takes too long is a 503 with Retry-After. Triton and the control plane are
faked (``FakeResidentTriton``); the real ones are in tests/e2e/test_many_models.py."""

import asyncio

import pytest
from starlette.testclient import TestClient

from fakes import FakeResidentTriton, FakeVersion, Recorder, Unmonitored, asgi
from infergate.config import FrontendSettings
from infergate.errors import ColdStartTimeout
from infergate.protocols.frontend import Frontend
from infergate.serving.inference import InferencePath
from infergate.serving.routing import ServedModel
from infergate.serving.tritons import Tritons
from infergate.serving.warming import Warmer


def path_of(triton: FakeResidentTriton, warmer: Warmer, *names: str) -> InferencePath:
    models = {
        name: ServedModel(name, "text-classification", (FakeVersion(name, calls_backend=True),))  # type: ignore[arg-type]
        for name in names
    }
    return InferencePath(triton, models, warmer=warmer, monitors=Unmonitored(Recorder()))  # type: ignore[arg-type]


async def ask(path: InferencePath, name: str):
    from infergate.serving.access import OPEN

    call = path.call(OPEN, name)
    with call:
        return await path.infer(call, path.model(name), ["hi"], {})


def test_many_requests_for_a_cold_version_make_one_load_and_all_get_answers():
    async def scenario():
        triton = FakeResidentTriton("hot__v1", load_s=0.5)  # long: the hot call is done first
        warmer = Warmer(triton.warm, timeout_s=5)
        warmer.set_resident(1, {"hot__v1": ["t:1"]})
        path = path_of(triton, warmer, "hot", "cold")
        cold = [asyncio.create_task(ask(path, "cold")) for _ in range(20)]
        await asyncio.sleep(0.01)
        # A hot version answers at once while the cold one loads.
        hot = await ask(path, "hot")
        assert hot.cold_start_s == 0 and not any(task.done() for task in cold)
        answers = await asyncio.gather(*cold)
        assert triton.warmed == ["cold__v1"]  # one load for twenty requests
        assert all(a.cold_start_s >= 0.4 for a in answers)
        # Loaded now: the next request is not a cold start and asks nobody.
        assert (await ask(path, "cold")).cold_start_s == 0 and triton.warmed == ["cold__v1"]
        assert warmer.take_used() == ["cold__v1", "hot__v1"] and warmer.take_used() == []

    asyncio.run(scenario())


def test_a_version_moved_to_another_triton_is_asked_for_and_found_there():
    """The replica's word says Triton a holds it; a lost it (unloaded, or does not answer):
    the call fails there, the control plane loads it on b and says so, and the retry
    goes to b."""

    async def scenario() -> tuple[FakeResidentTriton, FakeResidentTriton, object]:
        a, b = FakeResidentTriton(), FakeResidentTriton()
        for triton, url in ((a, "a:1"), (b, "b:1")):
            triton.url, triton.timeout_s = url, 5.0  # type: ignore[attr-defined]

        async def warm(model: str, timeout_s: float) -> tuple[str | None, list[str]]:
            await b.warm(model, timeout_s)
            return None, ["b:1"]

        warmer = Warmer(warm, timeout_s=5)
        warmer.set_resident(1, {"m__v1": ["a:1"]})
        channels = {"a:1": a, "b:1": b}
        tritons = Tritons(
            a, lambda url, timeout_s: channels[url], lambda m: warmer.holders.get(m, ())
        )  # type: ignore[arg-type]
        models = {
            "m": ServedModel("m", "text-classification", (FakeVersion("m", calls_backend=True),))
        }  # type: ignore[arg-type]
        path = InferencePath(tritons, models, warmer=warmer, monitors=Unmonitored(Recorder()))  # type: ignore[arg-type]
        return a, b, await ask(path, "m")

    a, b, answer = asyncio.run(scenario())
    assert a.calls == ["m__v1"] and b.calls == ["m__v1"] and b.warmed == ["m__v1"]
    assert answer.cold_start_s > 0  # type: ignore[attr-defined]


def test_a_version_unloaded_behind_the_replicas_back_is_loaded_again():
    async def scenario():
        triton = FakeResidentTriton()
        warmer = Warmer(triton.warm, timeout_s=5)
        warmer.set_resident(3, {"m__v1": ["t:1"]})  # the word is stale: Triton unloaded it since
        answer = await ask(path_of(triton, warmer, "m"), "m")
        assert answer.cold_start_s > 0 and triton.warmed == ["m__v1"]
        assert triton.calls == ["m__v1", "m__v1"]  # failed, then answered

    asyncio.run(scenario())


def test_a_load_past_the_deadline_or_refused_is_a_503_with_retry_after():
    async def scenario(triton: FakeResidentTriton, timeout_s: float) -> ColdStartTimeout:
        warmer = Warmer(triton.warm, timeout_s=timeout_s)
        warmer.set_resident(1, {})
        with pytest.raises(ColdStartTimeout) as raised:
            await ask(path_of(triton, warmer, "m"), "m")
        return raised.value

    slow = asyncio.run(scenario(FakeResidentTriton(load_s=10), 0.05))
    assert slow.status == 503 and "0.05 s" in slow.message
    assert slow.headers() == {"Retry-After": "2"}
    refused = asyncio.run(scenario(FakeResidentTriton(refuse="no room: budget 3"), 1.0))
    assert refused.status == 503 and "no room: budget 3" in refused.message
    assert refused.headers() == {"Retry-After": "1"}


def test_without_load_on_demand_nothing_is_asked_and_unavailable_stays_a_503():
    async def scenario():
        triton = FakeResidentTriton()
        with pytest.raises(Exception, match="cannot serve this model"):
            await ask(path_of(triton, Warmer(), "m"), "m")
        assert triton.warmed == [] and triton.calls == ["m__v1"]

    asyncio.run(scenario())


def test_the_answer_says_how_long_the_cold_start_took_and_the_list_what_is_loaded():
    triton = FakeResidentTriton("hot__v1", load_s=0.02)
    warmer = Warmer(triton.warm, timeout_s=5)
    warmer.set_resident(1, {"hot__v1": ["t:1"]})
    models = {
        name: ServedModel(name, "text-classification", (FakeVersion(name, calls_backend=True),))  # type: ignore[arg-type]
        for name in ("hot", "cold")
    }
    frontend = Frontend(
        FrontendSettings(), triton, models, warmer=warmer, monitors=Unmonitored(Recorder())
    )  # type: ignore[arg-type]
    client = TestClient(asgi(frontend))
    listed = {
        m["name"]: m["versions"][0]["loaded"] for m in client.get("/v1/models").json()["models"]
    }
    assert listed == {"hot": True, "cold": False}
    hot = client.post("/v1/models/hot/predict", json={"inputs": "hi"})
    assert hot.status_code == 200 and "x-cold-start" not in hot.headers
    cold = client.post("/v1/models/cold/predict", json={"inputs": "hi"})
    assert cold.status_code == 200 and float(cold.headers["x-cold-start"]) >= 0.02
    assert client.get("/v1/models/cold").json()["versions"][0]["loaded"] is True


def test_a_version_that_loads_on_demand_is_ready_without_being_loaded_for_the_check():
    """/v2/models/{name}/ready and gRPC ModelReady: a served version out of Triton answers
    its next request (a cold start), so it is ready; a loaded one is still probed."""
    from tritonclient.grpc import service_pb2

    from infergate.protocols import v2_grpc

    triton = FakeResidentTriton("hot__v1")
    warmer = Warmer(triton.warm, timeout_s=5)
    warmer.set_resident(
        1, {"hot__v1": ["t:1"], "gone__v1": ["t:1"]}
    )  # gone: Triton lost it, the word is stale
    models = {
        name: ServedModel(name, "text-classification", (FakeVersion(name, calls_backend=True),))  # type: ignore[arg-type]
        for name in ("hot", "cold", "gone")
    }
    probed: list[str] = []

    async def probe(runtime: FakeVersion) -> bool:  # a real request, as Triton answers it
        probed.append(runtime.triton_model)
        return runtime.triton_model in triton.loaded

    frontend = Frontend(
        FrontendSettings(), triton, models, readiness_probe=probe, warmer=warmer,  # type: ignore[arg-type]
        monitors=Unmonitored(Recorder()),
    )  # fmt: skip
    client = TestClient(asgi(frontend))
    assert client.get("/v2/models/cold/ready").json() == {"name": "cold", "ready": True}
    assert client.get("/v2/models/cold/versions/1/ready").status_code == 200
    assert client.get("/v2/models/hot/ready").status_code == 200
    gone = client.get("/v2/models/gone/ready")
    assert gone.status_code == 503 and "version(s) ['1']" in gone.json()["error"]

    def model_ready(name: str) -> dict:
        request = service_pb2.ModelReadyRequest(name=name)
        return asyncio.run(v2_grpc.answer(frontend, "ModelReady", request, {})).fields

    assert model_ready("cold") == {"ready": True}
    assert model_ready("hot") == {"ready": True} and model_ready("gone") == {"ready": False}
    # Checking readiness loaded nothing and probed only what is loaded.
    assert triton.warmed == [] and set(probed) == {"hot__v1", "gone__v1"}
    assert client.get("/v1/models/cold").json()["versions"][0]["loaded"] is False
