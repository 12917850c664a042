"""The Open Inference Protocol (KServe V2) over REST as its users speak it: NVIDIA's own
``tritonclient.http`` against the stack's front-end, its answers checked against
``/v1/models/{name}/predict``'s, with binary tensors and without."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as triton_http
from conftest import Stack, predict
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e
TEXTS = ["I love this film", "This is terrible", "An ordinary afternoon, nothing more"]


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[triton_http.InferenceServerClient]:
    with triton_http.InferenceServerClient(url=stack.url.removeprefix("http://")) as client:
        yield client


def texts_input(texts: list[str], binary: bool) -> triton_http.InferInput:
    tensor = triton_http.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary)
    return tensor


def test_server_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "infergate" and "binary_tensor_data" in metadata["extensions"]


def test_model_readiness(client):
    assert client.is_model_ready("sentiment") and client.is_model_ready("embed", "1")
    assert not client.is_model_ready("sentiment", "99")
    assert not client.is_model_ready("nope")


def test_model_metadata(client):
    sentiment = client.get_model_metadata("sentiment")
    assert sentiment["versions"] == ["1"]
    assert sentiment["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    probabilities, label = sentiment["outputs"]
    assert probabilities["shape"] == [-1, 2] and label["name"] == "label"
    assert sorted(probabilities["parameters"]["labels"]) == ["negative", "positive"]
    embed = client.get_model_metadata("embed", "1")
    assert embed["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]


@pytest.mark.parametrize("binary_input", [True, False], ids=["binary-in", "json-in"])
@pytest.mark.parametrize("binary_output", [True, False], ids=["binary-out", "json-out"])
def test_sentiment_answers_as_predict_does(client, http, binary_input, binary_output):
    labels = client.get_model_metadata("sentiment")["outputs"][0]["parameters"]["labels"]
    outputs = [triton_http.InferRequestedOutput(name, binary_data=binary_output)
               for name in ("label", "probabilities")]  # fmt: skip
    result = client.infer("sentiment", [texts_input(TEXTS, binary_input)], outputs=outputs)
    assert result.get_response()["model_version"] == "1"
    expected = predict(http, "sentiment", TEXTS).json()["outputs"]
    assert [label.decode() if binary_output else label for label in result.as_numpy("label")] == [
        row["label"] for row in expected
    ]
    probabilities = result.as_numpy("probabilities")
    assert probabilities.dtype == np.float32 and probabilities.shape == (len(TEXTS), 2)
    scores = [[row["scores"][label] for label in labels] for row in expected]
    np.testing.assert_allclose(probabilities, scores, atol=1e-4)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_embeddings_equal_predict_s(client, http, binary):
    outputs = [triton_http.InferRequestedOutput("embedding", binary_data=binary)]
    result = client.infer("embed", [texts_input(TEXTS, binary)], outputs=outputs)
    vectors = result.as_numpy("embedding")
    assert vectors.shape == (len(TEXTS), 384)
    expected = np.array(predict(http, "embed", TEXTS).json()["outputs"])
    np.testing.assert_allclose(vectors, expected, atol=1e-4)
    raw = client.infer("embed", [texts_input(TEXTS[:1], binary)], parameters={"normalize": False})
    assert abs(np.linalg.norm(raw.as_numpy("embedding")[0]) - 1.0) > 1e-2


def test_a_pinned_version_answers_and_an_unserved_one_is_not_found(client):
    result = client.infer("sentiment", [texts_input(TEXTS[:1], True)], model_version="1")
    assert result.get_response()["model_version"] == "1"
    with pytest.raises(InferenceServerException) as info:
        client.infer("sentiment", [texts_input(TEXTS[:1], True)], model_version="99")
    assert info.value.status() == "404" and "version '99'" in info.value.message()


def test_an_unknown_model_is_not_found(client):
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", [texts_input(TEXTS[:1], True)])
    assert info.value.status() == "404"
    assert "model 'nope' is not served" in info.value.message()
    with pytest.raises(InferenceServerException, match="not served"):
        client.get_model_metadata("nope")


def test_a_bad_request_gets_the_message_saying_what_is_wrong(client):
    with pytest.raises(InferenceServerException) as info:
        client.infer("sentiment", [texts_input(["fine", "   "], True)])
    assert info.value.status() == "422"
    assert "input 'text' element 1 is empty or only whitespace" in info.value.message()
