"""The Open Inference Protocol over gRPC without a server: the gRPC status of every typed
error, the adapting of ``tritonclient.grpc``'s own request messages to the REST request,
and each RPC answered by a front-end whose Triton is a stand-in, its answers read back by
``tritonclient.grpc``'s ``InferResult`` and compared with the REST endpoint's."""

import asyncio

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from starlette.testclient import TestClient
from test_kserve_v2 import MINILM, runtime, token_counts
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from fakes import FakeTritonBackend, Recorder, asgi
from infergate import errors
from infergate.config import FrontendSettings
from infergate.protocols import v2_grpc
from infergate.protocols.frontend import Frontend
from infergate.protocols.wire import Limits
from infergate.serving.access import Access, KeyEntry, KeyFile, digest, new_key, write_keys
from infergate.serving.routing import ServedModel
from infergate.serving.tokenization import TextTokenizer
from infergate.versions import CANARY

TEXTS = ["I love this film", "This is a much longer text, and it goes on and on"]
# The statuses the protocol's users expect for REST's (the list).
EXPECTED = {400: "INVALID_ARGUMENT", 422: "INVALID_ARGUMENT", 404: "NOT_FOUND",
            503: "UNAVAILABLE", 429: "RESOURCE_EXHAUSTED", 413: "RESOURCE_EXHAUSTED",
            401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 504: "DEADLINE_EXCEEDED"}  # fmt: skip


def every_error_class() -> list[type[errors.InfergateError]]:
    found, todo = [], [errors.InfergateError]
    while todo:
        kind = todo.pop()
        found.append(kind)
        todo.extend(kind.__subclasses__())
    return found


@pytest.mark.parametrize("kind", every_error_class(), ids=lambda kind: kind.__name__)
def test_every_typed_error_has_the_grpc_status_of_its_http_status(kind):
    assert kind.grpc_code in grpc.StatusCode.__members__
    if kind.status in EXPECTED:
        assert kind.grpc_code == EXPECTED[kind.status]
    elif kind.status >= 500:
        assert kind.grpc_code in ("INTERNAL", "UNAVAILABLE")


def test_a_refusal_keeps_the_rest_message():
    error = errors.ModelNotFound("model 'x' is not served; served models: a")
    assert v2_grpc.refusal(error) == v2_grpc.RpcAnswer({}, "NOT_FOUND", error.message)
    assert errors.RateLimited("slow down").grpc_code == "RESOURCE_EXHAUSTED"
    assert errors.BackendTimeout("late").grpc_code == "DEADLINE_EXCEEDED"


# -- adapting tritonclient.grpc's messages ------------------------------------------------


def texts_input(texts, shape=None) -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("text", shape or [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object).reshape(shape or [len(texts)]))
    return tensor


def floats_input() -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("text", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    return tensor


def infer_request(model, inputs, version="", outputs=None, parameters=None, request_id=""):
    """The message ``InferenceServerClient.infer`` sends."""
    return _get_inference_request(
        model_name=model, inputs=inputs, model_version=version, request_id=request_id,
        outputs=outputs, sequence_id=0, sequence_start=False, sequence_end=False,
        priority=0, timeout=None, parameters=parameters,
    )  # fmt: skip


def test_raw_contents_become_the_binary_extension_s_tensors():
    request = infer_request("m", [texts_input(["hé", "b"])], request_id="r7",
                            outputs=[triton_grpc.InferRequestedOutput("label")],
                            parameters={"normalize": False})  # fmt: skip
    payload, binary = v2_grpc.infer_payload(request)
    assert binary == b"\x03\x00\x00\x00h\xc3\xa9\x01\x00\x00\x00b"
    assert payload == {
        "id": "r7",
        "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(binary)}}],
        "outputs": [{"name": "label", "parameters": {}}],
        "parameters": {"normalize": False},
    }  # fmt: skip


def test_bytes_contents_read_as_raw_contents_do():
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name="text", datatype="BYTES", shape=[2, 1]
    )
    tensor.contents.bytes_contents.extend([b"first", b"second"])
    request = service_pb2.ModelInferRequest(model_name="m", inputs=[tensor])
    limits = Limits(max_body_bytes=1000, max_texts=4, max_chars_per_text=50)
    parsed = v2_grpc.parse_infer(request, limits, ("embedding",))
    assert parsed.texts == ["first", "second"]
    assert [o.name for o in parsed.extra["outputs"]] == ["embedding"]


def test_inputs_and_raw_contents_must_pair_up():
    request = infer_request("m", [texts_input(["a"])])
    request.inputs.append(request.inputs[0])
    with pytest.raises(errors.InvalidInput, match="1 raw_input_contents for 2 input"):
        v2_grpc.infer_payload(request)


# -- the RPCs on a front-end whose Triton is a stand-in ----------------------------------


@pytest.fixture(scope="module")
def models() -> dict[str, ServedModel]:
    tokenizer = TextTokenizer.from_dir(MINILM, max_length=32)
    sentiment = ServedModel("sentiment", "text-classification", (
        runtime(tokenizer, "sentiment", "text-classification", "1", "champion", 90),
        runtime(tokenizer, "sentiment", "text-classification", "2", CANARY, 10),
    ))  # fmt: skip
    embed = ServedModel("embed", "feature-extraction",
                        (runtime(tokenizer, "embed", "feature-extraction"),))  # fmt: skip
    return {"sentiment": sentiment, "embed": embed}


@pytest.fixture(scope="module")
def frontend(models) -> Frontend:
    triton = FakeTritonBackend(outputs=token_counts)
    return Frontend(FrontendSettings(max_texts_per_request=4), triton, models)


def call(frontend, rpc, request, **metadata) -> v2_grpc.RpcAnswer:
    return asyncio.run(v2_grpc.answer(frontend, rpc, request, metadata))


def infer(frontend, request, **metadata) -> triton_grpc.InferResult:
    answer = call(frontend, "ModelInfer", request, **metadata)
    assert answer.code == "OK", answer.details
    return triton_grpc.InferResult(service_pb2.ModelInferResponse(**answer.fields))


def test_health_and_metadata(frontend):
    assert call(frontend, "ServerLive", service_pb2.ServerLiveRequest()).fields == {"live": True}
    assert call(frontend, "ServerReady", service_pb2.ServerReadyRequest()).fields["ready"] is True
    server = service_pb2.ServerMetadataResponse(
        **call(frontend, "ServerMetadata", service_pb2.ServerMetadataRequest()).fields
    )
    assert server.name == "infergate" and list(server.extensions) == []
    asked = service_pb2.ModelMetadataRequest(name="sentiment", version="2")
    metadata = service_pb2.ModelMetadataResponse(**call(frontend, "ModelMetadata", asked).fields)
    assert list(metadata.versions) == ["2"] and metadata.platform == "infergate"
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
        ("probabilities", "FP32", [-1, 2]), ("label", "BYTES", [-1])
    ]  # fmt: skip
    ready = service_pb2.ModelReadyRequest
    assert call(frontend, "ModelReady", ready(name="embed")).fields == {"ready": True}
    assert call(frontend, "ModelReady", ready(name="nope")).fields == {"ready": False}
    assert call(frontend, "ModelReady", ready(name="embed", version="9")).fields == {"ready": False}


def test_infer_answers_as_the_rest_endpoint(frontend):
    client = TestClient(asgi(frontend))
    result = infer(frontend, infer_request("sentiment", [texts_input(TEXTS)], version="1",
                                           request_id="r1"))  # fmt: skip
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("sentiment", "1", "r1")
    rest = client.post("/v2/models/sentiment/versions/1/infer",
                       json={"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                                         "data": TEXTS}]}).json()  # fmt: skip
    probabilities = result.as_numpy("probabilities")
    assert probabilities.dtype == np.float32 and probabilities.shape == (2, 2)
    np.testing.assert_array_equal(probabilities.ravel(), np.float32(rest["outputs"][0]["data"]))
    assert [label.decode() for label in result.as_numpy("label")] == rest["outputs"][1]["data"]
    vectors = infer(frontend, infer_request("embed", [texts_input(TEXTS, [2, 1])],
                                            parameters={"normalize": False}))  # fmt: skip
    unit_free = {"inputs": TEXTS, "parameters": {"normalize": False}}
    raw = client.post("/v1/models/embed/predict", json=unit_free).json()
    np.testing.assert_allclose(vectors.as_numpy("embedding"), raw["outputs"], rtol=1e-6)


def test_the_version_field_pins_and_trailers_say_which_answered(frontend):
    answer = call(frontend, "ModelInfer", infer_request("sentiment", [texts_input(TEXTS)], "2"))
    assert answer.fields["model_version"] == "2"
    trailers = dict(answer.trailers)
    assert trailers["x-model-version"] == "2" and float(trailers["x-compute-time"]) >= 0
    pinned = call(frontend, "ModelInfer", infer_request("sentiment", [texts_input(TEXTS)]),
                  **{"x-model-version": "2"})  # fmt: skip
    assert pinned.fields["model_version"] == "2"


@pytest.mark.parametrize("request_, code, message", [
    (infer_request("nope", [texts_input(["a"])]), "NOT_FOUND", "model 'nope' is not served"),
    (infer_request("sentiment", [texts_input(["a"])], "9"), "NOT_FOUND", "version '9'"),
    (infer_request("sentiment", [texts_input(["a"] * 5)]), "RESOURCE_EXHAUSTED", "5 texts"),
    (infer_request("sentiment", [texts_input(["a"])], parameters={"top_k": 2}),
     "INVALID_ARGUMENT", "unknown parameter 'top_k'"),
    (infer_request("sentiment", [texts_input(["a"])],
                   outputs=[triton_grpc.InferRequestedOutput("logits")]),
     "INVALID_ARGUMENT", "unknown output 'logits'"),
    (infer_request("sentiment", [floats_input()]), "INVALID_ARGUMENT", "has datatype 'FP32'"),
], ids=["model", "version", "too-many", "parameter", "output", "datatype"])  # fmt: skip
def test_bad_requests_get_the_rest_message_and_their_status(frontend, request_, code, message):
    answer = call(frontend, "ModelInfer", request_)
    assert (answer.code, answer.fields) == (code, {})
    assert message in answer.details


def test_a_replica_still_starting_is_unavailable_but_live():
    assert call(None, "ServerLive", service_pb2.ServerLiveRequest()).fields == {"live": True}
    assert call(None, "ServerReady", service_pb2.ServerReadyRequest()).fields == {"ready": False}
    answer = call(None, "ModelInfer", infer_request("m", [texts_input(["a"])]))
    assert answer.code == "UNAVAILABLE" and "still starting" in answer.details


def test_api_keys_as_on_rest(tmp_path, models):
    scoped, anything = new_key(), new_key()
    path = tmp_path / "keys.yaml"
    write_keys(path, KeyFile(keys=[
        KeyEntry(id="search", sha256=digest(scoped), models=("embed",)),
        KeyEntry(id="ops", sha256=digest(anything), models=("*",)),
    ]))  # fmt: skip
    recorder = Recorder()
    frontend = Frontend(FrontendSettings(), FakeTritonBackend(outputs=token_counts), models,
                        telemetry=recorder, monitors=recorder, access=Access(path))  # fmt: skip
    request = infer_request("sentiment", [texts_input(["a"])])
    missing = call(frontend, "ModelInfer", request)
    assert missing.code == "UNAUTHENTICATED" and "API key is required" in missing.details
    wrong = call(frontend, "ModelInfer", request, authorization=f"Bearer {new_key()}")
    assert wrong.code == "UNAUTHENTICATED" and "not valid" in wrong.details
    outside = call(frontend, "ModelInfer", request, authorization=f"Bearer {scoped}")
    assert outside.code == "PERMISSION_DENIED"
    assert call(frontend, "ModelInfer", request, authorization=f"Bearer {anything}").code == "OK"
    metadata = service_pb2.ModelMetadataRequest(name="sentiment")
    assert call(frontend, "ModelMetadata", metadata).code == "UNAUTHENTICATED"
    assert call(frontend, "ServerLive", service_pb2.ServerLiveRequest()).code == "OK"
    assert recorder.callers == [("search", "sentiment", 403), ("ops", "sentiment", 200)]
