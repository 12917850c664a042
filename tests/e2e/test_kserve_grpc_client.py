"""The Open Inference Protocol (KServe V2) over gRPC as its users speak it: NVIDIA's own
``tritonclient.grpc``, unchanged, against the stack's gRPC ingress (Ray Serve's, on
``frontend.grpc_port``), its answers checked against the REST V2 endpoint's
(``tritonclient.http``) and ``/v1/models/{name}/predict``'s for the same texts."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from conftest import Stack, predict
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e
TEXTS = ["I love this film", "This is terrible", "An ordinary afternoon, nothing more"]


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[triton_grpc.InferenceServerClient]:
    url = f"127.0.0.1:{stack.env['INFERGATE_FRONTEND__GRPC_PORT']}"
    with triton_grpc.InferenceServerClient(url=url) as client:
        yield client


@pytest.fixture(scope="module")
def rest(stack: Stack) -> Iterator[triton_http.InferenceServerClient]:
    with triton_http.InferenceServerClient(url=stack.url.removeprefix("http://")) as client:
        yield client


def grpc_texts(texts: list[str]) -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object))
    return tensor


def rest_texts(texts: list[str]) -> triton_http.InferInput:
    tensor = triton_http.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object))
    return tensor


def refusal(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def test_server_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "infergate" and metadata["version"]


def test_model_readiness(client):
    assert client.is_model_ready("sentiment") and client.is_model_ready("embed", "1")
    assert not client.is_model_ready("sentiment", "99")
    assert not client.is_model_ready("nope")


def test_model_metadata_as_rest_gives_it(client, rest):
    for name in ("sentiment", "embed"):
        metadata = client.get_model_metadata(name, as_json=True)
        expected = rest.get_model_metadata(name)
        assert metadata["versions"] == expected["versions"] == ["1"]
        assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1"]}]
        assert [(t["name"], t["datatype"]) for t in metadata["outputs"]] == [
            (t["name"], t["datatype"]) for t in expected["outputs"]
        ]


def test_sentiment_answers_equal_the_rest_endpoint_s(client, rest, http):
    result = client.infer("sentiment", [grpc_texts(TEXTS)])
    assert result.get_response().model_version == "1"
    expected = rest.infer("sentiment", [rest_texts(TEXTS)])
    probabilities = result.as_numpy("probabilities")
    assert probabilities.dtype == np.float32 and probabilities.shape == (len(TEXTS), 2)
    np.testing.assert_array_equal(probabilities, expected.as_numpy("probabilities"))
    np.testing.assert_array_equal(result.as_numpy("label"), expected.as_numpy("label"))
    labels = [row["label"] for row in predict(http, "sentiment", TEXTS).json()["outputs"]]
    assert [label.decode() for label in result.as_numpy("label")] == labels


def test_embeddings_equal_the_rest_endpoint_s(client, rest):
    outputs = [triton_grpc.InferRequestedOutput("embedding")]
    vectors = client.infer("embed", [grpc_texts(TEXTS)], outputs=outputs).as_numpy("embedding")
    assert vectors.shape == (len(TEXTS), 384)
    expected = rest.infer("embed", [rest_texts(TEXTS)]).as_numpy("embedding")
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
    raw = client.infer("embed", [grpc_texts(TEXTS[:1])], parameters={"normalize": False})
    assert abs(np.linalg.norm(raw.as_numpy("embedding")[0]) - 1.0) > 1e-2


def test_a_pinned_version_answers_and_an_unserved_one_is_not_found(client):
    result = client.infer("sentiment", [grpc_texts(TEXTS[:1])], model_version="1")
    assert result.get_response().model_version == "1"
    error = refusal(lambda: client.infer("sentiment", [grpc_texts(TEXTS[:1])], model_version="99"))
    assert error.status() == "StatusCode.NOT_FOUND" and "version '99'" in error.message()


def test_an_unknown_model_is_not_found(client):
    error = refusal(lambda: client.infer("nope", [grpc_texts(TEXTS[:1])]))
    assert error.status() == "StatusCode.NOT_FOUND"
    assert "model 'nope' is not served" in error.message()
    metadata = refusal(lambda: client.get_model_metadata("nope"))
    assert metadata.status() == "StatusCode.NOT_FOUND"


def test_a_bad_request_gets_the_rest_message_as_invalid_argument(client, rest):
    texts = ["fine", "   "]
    error = refusal(lambda: client.infer("sentiment", [grpc_texts(texts)]))
    expected = refusal(lambda: rest.infer("sentiment", [rest_texts(texts)]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and expected.status() == "422"
    assert "input 'text' element 1 is empty or only whitespace" in error.message()
    assert error.message() == expected.message()
    floats = triton_grpc.InferInput("text", [1], "FP32")
    floats.set_data_from_numpy(np.ones(1, np.float32))
    wrong = refusal(lambda: client.infer("sentiment", [floats]))
    assert wrong.status() == "StatusCode.INVALID_ARGUMENT" and "'BYTES'" in wrong.message()
    other_task = refusal(lambda: client.infer("ner", [grpc_texts(TEXTS[:1])]))
    assert other_task.status() == "StatusCode.INVALID_ARGUMENT"
    assert "use POST /v1/models/{name}/predict" in other_task.message()


def test_a_message_past_the_body_limit_is_refused_before_it_is_read(client, stack):
    """gRPC refuses it from its length prefix (the replicas' limit is the REST body limit
    and some framing), as REST refuses a body past ``frontend.max_body_bytes``: 413."""
    huge = ["a " * 600_000]  # 1.2 MB, past the stack's 1 MiB
    error = refusal(lambda: client.infer("sentiment", [grpc_texts(huge)]))
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED", error.message()
    print(f"\n1.2 MB over gRPC: {error.message()}")
    # gRPC's own words (the front-end's size check would say REST's 413 message).
    assert "larger than max" in error.message().lower(), error.message()
    assert client.infer("sentiment", [grpc_texts(TEXTS[:1])]).as_numpy("label").size == 1
