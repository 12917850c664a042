"""OpenAI's own python package against the running stack's OpenAI-compatible embeddings,
as a user of OpenAI's API would point it at the platform."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import openai
import pytest
from conftest import predict

pytestmark = pytest.mark.e2e
TEXTS = ["A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell."]


@pytest.fixture(scope="module")
def client(stack) -> Iterator[openai.OpenAI]:
    # No retries: an error must reach the test as the class its status maps to.
    with openai.OpenAI(
        base_url=f"{stack.url}/openai/v1", api_key="unused", max_retries=0, timeout=60
    ) as client:
        yield client


def vectors(response) -> np.ndarray:
    return np.array([item.embedding for item in response.data])


def test_embeddings_equal_the_predict_endpoints(client, http):
    expected = np.array(predict(http, "embed", TEXTS).json()["outputs"])
    assert expected.shape == (3, 384)
    default = client.embeddings.create(model="embed", input=TEXTS)  # base64 on the wire
    floats = client.embeddings.create(model="embed", input=TEXTS, encoding_format="float")
    for response in (default, floats):
        assert response.model == "embed" and [item.index for item in response.data] == [0, 1, 2]
        np.testing.assert_allclose(vectors(response), expected, atol=1e-6)
    # Alone, against the predict endpoint's answer for it alone: the quantised graph's
    # activation scales span the batch, so a text's vector moves a little with its company.
    alone = np.array(predict(http, "embed", TEXTS[0]).json()["outputs"])
    single = client.embeddings.create(model="embed", input=TEXTS[0])
    np.testing.assert_allclose(vectors(single), alone, atol=1e-6)


def test_dimensions_cut_and_scale_back_to_unit_length(client):
    full = vectors(client.embeddings.create(model="embed", input=TEXTS))
    cut = vectors(client.embeddings.create(model="embed", input=TEXTS, dimensions=64))
    assert cut.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)
    leading = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, leading, atol=1e-5)
    with pytest.raises(openai.UnprocessableEntityError, match="ask for 1 to 384"):
        client.embeddings.create(model="embed", input="a", dimensions=385)


def test_usage_counts_the_tokens_of_every_text(client):
    response = client.embeddings.create(model="embed", input=TEXTS)
    each = [client.embeddings.create(model="embed", input=text).usage for text in TEXTS]
    assert response.usage.prompt_tokens > 0
    assert response.usage.prompt_tokens == sum(usage.prompt_tokens for usage in each)
    assert response.usage.total_tokens == response.usage.prompt_tokens


def test_the_version_and_timing_headers_come_along(client):
    raw = client.embeddings.with_raw_response.create(model="embed", input="hello")
    assert raw.headers["x-model-version"] == "1" and float(raw.headers["x-compute-time"]) > 0
    assert len(raw.parse().data[0].embedding) == 384


def test_models_are_listed_and_retrieved(client):
    listed = {model.id: model for model in client.models.list()}
    assert {"embed", "sentiment"} <= set(listed)
    assert listed["embed"].object == "model" and listed["embed"].owned_by == "infergate"
    assert client.models.retrieve("embed").id == "embed"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_errors_raise_the_class_their_status_maps_to(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="no-such-model", input="hello")
    assert missing.value.code == "model_not_found" and missing.value.param == "model"
    assert "served models" in missing.value.message
    for empty in ("", [], ["fine", "   "]):
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            client.embeddings.create(model="embed", input=empty)
        assert refused.value.param == "input"
    with pytest.raises(openai.UnprocessableEntityError, match="token ids"):
        client.embeddings.create(model="embed", input=[101, 7592, 102])
    with pytest.raises(openai.UnprocessableEntityError, match="makes no embeddings"):
        client.embeddings.create(model="sentiment", input="hello")
    # A body said to be compressed is refused rather than read (no endpoint decompresses).
    with pytest.raises(openai.APIStatusError) as compressed:
        client.embeddings.create(
            model="embed", input="hello", extra_headers={"content-encoding": "gzip"}
        )
    assert compressed.value.status_code == 415
    assert "content-encoding 'gzip' is not supported" in compressed.value.message


def test_the_root_path_answers_too(http):
    response = http.post("/v1/embeddings", json={"model": "embed", "input": "hello"})
    assert response.status_code == 200 and response.json()["object"] == "list"
