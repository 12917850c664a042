"""Hugging Face's ``huggingface_hub.InferenceClient``, unchanged, given a model's
Text Embeddings Inference base URL on the running stack (``/tei/{model}``), as a user of
TEI would point it at the platform; TEI's documented bodies sent with httpx; and named
prompts end to end, from ``infergate register --prompt`` (and a sentence-transformers
config) to the answers and the usage they count.

The demo's ``embed`` (all-MiniLM-L6-v2), ``sentiment`` and ``ner`` answer the client;
this module registers tiny models for what the demo lacks: an embedding model with
prompts, a sparse one and a cross-encoder."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from conftest import Stack, predict, wait_for
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
from tritonclient.utils import InferenceServerException

from readme_blocks import bash_commands, readme_blocks
from tiny_models import tiny_bert

pytestmark = pytest.mark.e2e
TEXTS = ["A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell."]
# The tiny models' vocabulary is a few dozen words (tests/tiny_models.py): the folder's
# prompts are made of them, so that two prompts tokenize differently (unknown words all
# become [UNK]); "plain", empty, sends a text as it is.
FOLDER_PROMPTS = {"title": "the film ", "review": "this is "}
PROMPTED = "tei-prompted"
TINY_TEXTS = ["i love this film", "the food was bad"]


def documented_prompt_options() -> list[str]:
    """The prompt options of the registration docs/registration.md shows (the block
    marked as checked by this module)."""
    this = "tests/e2e/" + Path(__file__).name
    (block,) = [
        block
        for block in readme_blocks()
        if block.marker is not None and block.marker[1].split()[0] == this
    ]
    assert block.page == "docs/registration.md"
    (command,) = bash_commands(block.code)
    words = shlex.split(command)
    options = [
        item
        for i, word in enumerate(words)
        if word in ("--prompt", "--default-prompt")
        for item in (word, words[i + 1])
    ]
    assert options, command
    return options


DOCUMENTED = documented_prompt_options()  # query=query: , passage=passage: , default query
MODELS = {
    PROMPTED: ("feature-extraction", (*DOCUMENTED, "--prompt", "plain=")),
    "tei-splade": ("sparse-embedding", ()),
    "tei-rerank": ("text-ranking", ()),
}


@pytest.fixture(scope="module")
def stack(stack: Stack) -> Stack:
    """The session's stack with this module's tiny models registered as champions over the
    CLI; the embedding model's folder carries sentence-transformers' prompts config, and
    its command line the prompts docs/registration.md shows."""
    for name, (task, options) in MODELS.items():
        labels = ("relevance",) if task == "text-ranking" else ("unused",)
        folder = tiny_bert(stack.state_dir / name, task, labels=labels)
        if name == PROMPTED:
            config = {"prompts": FOLDER_PROMPTS, "default_prompt_name": None}
            (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
        stack.register(folder, name, task, "--precision", "fp32", "--alias", "champion", *options)
    return stack


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        for name in MODELS:
            wait_for(lambda n=name: client.get(f"/tei/{n}/info").status_code == 200, 180, name)
        yield client


def tei(stack: Stack, model: str) -> InferenceClient:
    return InferenceClient(base_url=f"{stack.url}/tei/{model}", timeout=60)


# -- huggingface_hub's InferenceClient, unchanged -------------------------------------------


def test_feature_extraction_equals_the_predict_endpoints(stack, http):
    expected = np.array(predict(http, "embed", TEXTS).json()["outputs"], dtype=np.float32)
    vectors = tei(stack, "embed").feature_extraction(TEXTS)
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
    raw = predict(http, "embed", TEXTS, parameters={"normalize": False}).json()["outputs"]
    np.testing.assert_allclose(
        tei(stack, "embed").feature_extraction(TEXTS, normalize=False), raw, rtol=1e-5
    )
    cut = tei(stack, "embed").feature_extraction(TEXTS, dimensions=64)
    leading = np.array(raw)[:, :64]
    np.testing.assert_allclose(
        cut, leading / np.linalg.norm(leading, axis=1, keepdims=True), atol=1e-5
    )


def test_text_classification_answers_the_predict_endpoints_label(stack, http):
    for text in ("I love this film", "The service was slow and the food was cold"):
        expected = predict(http, "sentiment", text).json()["outputs"][0]
        # TEI answers one text with its labels best first, and huggingface_hub returns the
        # first element of the list it gets: the best label (as against TEI itself).
        best = tei(stack, "sentiment").text_classification(text)
        assert best.label == expected["label"]
        assert best.score == pytest.approx(expected["score"], abs=1e-6)


def test_token_classification_answers_the_predict_endpoints_entities(stack, http):
    text = "My name is Wolfgang and I live in Berlin"
    expected = predict(http, "ner", text).json()["outputs"][0]
    entities = tei(stack, "ner").token_classification(text)
    assert [e.entity_group for e in entities] == [e["entity"] for e in expected]
    assert [(e.word, e.start, e.end) for e in entities] == [
        (e["word"], e["start"], e["end"]) for e in expected
    ]
    assert [e.score for e in entities] == pytest.approx([e["score"] for e in expected], abs=1e-6)
    assert entities  # the comparison compared something


def test_sentence_similarity_is_the_cosine_of_the_predict_endpoints_vectors(stack, http):
    vectors = np.array(predict(http, "embed", TEXTS).json()["outputs"])
    scores = tei(stack, "embed").sentence_similarity(TEXTS[0], TEXTS[1:])
    np.testing.assert_allclose(scores, vectors[1:] @ vectors[0], atol=1e-5)
    assert scores[0] > scores[1]  # the two guitar sentences are the nearer pair


def test_errors_reach_the_client_with_teis_body(stack, http):
    with pytest.raises(HfHubHTTPError) as refused:
        tei(stack, "embed").feature_extraction("hello", dimensions=385)
    assert refused.value.response.status_code == 422
    assert refused.value.response.json()["error_type"] == "validation"
    assert "ask for 1 to 384" in refused.value.response.json()["error"]
    with pytest.raises(HfHubHTTPError) as missing:
        tei(stack, "no-such-model").feature_extraction("hello")
    assert missing.value.response.status_code == 404
    # The root of a base URL answers the route of its model's task, as TEI's does: a
    # classifier's labels, whatever the client asked for.
    labels = http.post("/tei/sentiment", json={"inputs": "hello"}).json()
    assert {item["label"] for item in labels} == {"negative", "positive"}


# -- TEI's documented bodies, with httpx -----------------------------------------------------


def test_teis_documented_bodies(http):
    body = {"inputs": "What is Deep Learning?", "normalize": True, "truncate": True}
    embedded = http.post("/tei/embed/embed", json=body)
    assert embedded.status_code == 200 and len(embedded.json()[0]) == 384
    assert embedded.headers["x-model-version"] == "1"
    batch = {"inputs": [["I like this film."], ["I hate this film."]]}
    labels = http.post("/tei/sentiment/predict", json=batch).json()
    assert [text[0]["label"] for text in labels] == ["positive", "negative"]
    assert all(text[0]["score"] >= text[1]["score"] for text in labels)
    ranked = http.post("/tei/tei-rerank/rerank", json={
        "query": "What is Deep Learning?", "texts": ["Deep Learning is ...", "Cheese is ..."],
        "return_text": True, "raw_scores": False})  # fmt: skip
    assert ranked.status_code == 200, ranked.text
    assert sorted(r["index"] for r in ranked.json()) == [0, 1]
    assert {r["text"] for r in ranked.json()} == {"Deep Learning is ...", "Cheese is ..."}
    sparse = http.post("/tei/tei-splade/embed_sparse", json={"inputs": TINY_TEXTS})
    assert sparse.status_code == 200, sparse.text
    native = predict(http, "tei-splade", TINY_TEXTS).json()["outputs"]
    for terms, output in zip(sparse.json(), native, strict=True):
        assert {t["index"]: t["value"] for t in terms} == pytest.approx(
            dict(zip(output["indices"], output["values"], strict=True))
        )
    tokens = http.post("/tei/embed/tokenize", json={"inputs": "test", "add_special_tokens": True})
    assert [(t["text"], t["special"]) for t in tokens.json()[0]] == [
        ("[CLS]", True), ("test", False), ("[SEP]", True)]  # fmt: skip
    ids = [t["id"] for t in tokens.json()[0]]
    assert http.post("/tei/embed/decode", json={"ids": ids}).json() == ["test"]
    info = http.get("/tei/sentiment/info").json()
    assert info["model_id"] == "sentiment" and "classifier" in info["model_type"]
    assert info["max_client_batch_size"] > 0 and info["max_input_length"] > 0


def test_a_route_of_another_task_is_teis_424(http):
    refused = http.post("/tei/embed/rerank", json={"query": "q", "texts": ["a"]})
    assert refused.status_code == 424
    assert set(refused.json()) == {"error", "error_type"} and "text-ranking" in refused.text


# -- named prompts ---------------------------------------------------------------------------


def embed(http: httpx.Client, texts: list[str], prompt: str | None = None) -> np.ndarray:
    body = {"inputs": texts, **({"prompt_name": prompt} if prompt else {})}
    reply = http.post(f"/tei/{PROMPTED}/embed", json=body)
    assert reply.status_code == 200, reply.text
    return np.array(reply.json())


def test_registration_keeps_the_folders_prompts_and_the_command_lines(http):
    info = http.get(f"/tei/{PROMPTED}/info").json()
    assert info["prompts"] == {
        **FOLDER_PROMPTS, "query": "query: ", "passage": "passage: ", "plain": ""}  # fmt: skip
    assert info["default_prompt_name"] == "query"


def test_a_named_prompt_is_put_before_each_text(stack, http):
    # "plain" is empty: a text sent with it is what the model sees.
    for name, prompt in [("title", "the film "), ("review", "this is ")]:
        prompted = embed(http, TINY_TEXTS, name)
        np.testing.assert_allclose(
            prompted, embed(http, [prompt + t for t in TINY_TEXTS], "plain"), atol=1e-6
        )
        assert not np.allclose(prompted, embed(http, TINY_TEXTS, "plain"), atol=1e-3)
    # The default prompt, when the request names none: on TEI's, the native and OpenAI's.
    expected = embed(http, ["query: " + t for t in TINY_TEXTS], "plain")
    np.testing.assert_allclose(embed(http, TINY_TEXTS), expected, atol=1e-6)
    native = predict(http, PROMPTED, TINY_TEXTS).json()["outputs"]
    np.testing.assert_allclose(native, expected, atol=1e-6)
    body = {"model": PROMPTED, "input": TINY_TEXTS}
    openai = http.post("/openai/v1/embeddings", json=body).json()["data"]
    np.testing.assert_allclose([item["embedding"] for item in openai], expected, atol=1e-6)
    client = tei(stack, PROMPTED)
    np.testing.assert_allclose(client.feature_extraction(TINY_TEXTS), expected, atol=1e-6)
    np.testing.assert_allclose(
        client.feature_extraction(TINY_TEXTS, prompt_name="title"),
        embed(http, TINY_TEXTS, "title"),
        atol=1e-6,
    )


def test_usage_counts_the_prompts_tokens(http):
    def usage(prompt: str) -> int:
        body = {"model": PROMPTED, "input": TINY_TEXTS, "prompt_name": prompt}
        reply = http.post("/openai/v1/embeddings", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()["usage"]["prompt_tokens"]

    assert usage("title") == usage("plain") + 2 * len(TINY_TEXTS)  # "the", "film" per text
    tokens = http.post(f"/tei/{PROMPTED}/tokenize", json={"inputs": "a book",
                                                          "prompt_name": "title"})  # fmt: skip
    assert [t["text"] for t in tokens.json()[0]] == ["[CLS]", "the", "film", "a", "book", "[SEP]"]


def test_an_unknown_prompt_name_is_refused_on_every_protocol(stack, http):
    for path, body in [
        (f"/tei/{PROMPTED}/embed", {"inputs": "a", "prompt_name": "nope"}),
        (f"/v1/models/{PROMPTED}/predict", {"inputs": "a", "parameters": {"prompt_name": "nope"}}),
        ("/openai/v1/embeddings", {"model": PROMPTED, "input": "a", "prompt_name": "nope"}),
    ]:
        reply = http.post(path, json=body)
        assert reply.status_code == 422, (path, reply.text)
        assert "no prompt called 'nope'; its prompts are 'passage', 'plain', 'query'" in reply.text
    with pytest.raises(HfHubHTTPError) as refused:
        tei(stack, PROMPTED).feature_extraction("a", prompt_name="nope")
    assert refused.value.response.status_code == 422


# -- the end of a long text, pairs, /embed_all, /health, /metrics ----------------------------


def test_left_truncation_keeps_the_end_of_a_long_text(stack, http):
    limit = http.get("/tei/embed/info").json()["max_input_length"]
    tail = "A man is playing a guitar on the stage tonight."
    bare = {"inputs": tail, "add_special_tokens": False}
    tail_tokens = len(http.post("/tei/embed/tokenize", json=bare).json()[0])
    # What the model sees of a long text cut at the left: as many "hello"s as fit, then tail.
    kept_end = "hello " * (limit - 2 - tail_tokens) + tail
    kept_start = "hello " * (limit - 2)
    long = "hello " * (2 * limit) + tail
    client = tei(stack, "embed")
    left = client.feature_extraction(long, truncation_direction="left")
    expected_end = predict(http, "embed", kept_end).json()["outputs"]
    np.testing.assert_allclose(left, expected_end, atol=1e-5)
    right = client.feature_extraction(long)
    np.testing.assert_allclose(right, predict(http, "embed", kept_start).json()["outputs"],
                               atol=1e-5)  # fmt: skip
    assert not np.allclose(left, right, atol=1e-3)  # the two ends are different texts
    # TEI's own spelling, on /embed_sparse too; and the next request is cut at the right.
    sparse = http.post("/tei/tei-splade/embed_sparse",
                       json={"inputs": "the food " * 300 + TINY_TEXTS[0],
                             "truncation_direction": "Left"})  # fmt: skip
    assert sparse.status_code == 200, sparse.text
    np.testing.assert_allclose(client.feature_extraction(long), right, atol=1e-6)


def test_pairs_on_predict_score_as_rerank_does(http):
    query, texts = "the film", ["i love this film", "the food was bad"]
    ranked = http.post("/tei/tei-rerank/rerank", json={"query": query, "texts": texts}).json()
    scores = {r["index"]: r["score"] for r in ranked}
    pairs = http.post("/tei/tei-rerank/predict", json={"inputs": [[query, t] for t in texts]})
    assert pairs.status_code == 200, pairs.text
    for index, labels in enumerate(pairs.json()):
        assert [item["label"] for item in labels] == ["LABEL_0"]
        assert labels[0]["score"] == pytest.approx(scores[index], abs=1e-6)
    one = http.post("/tei/tei-rerank/predict", json={"inputs": [query, texts[0]]}).json()
    assert one == pairs.json()[0]
    refused = http.post("/tei/sentiment/predict", json={"inputs": [["a", "b"]]})
    assert refused.status_code == 422 and refused.json()["error_type"] == "validation"
    assert "which reads one text" in refused.json()["error"]


def test_the_top_level_rerank_cuts_the_end_it_is_asked_to(http):
    """``POST /rerank`` takes TEI's ``truncation_direction`` as ``/tei/{model}/rerank``
    does: the same scores for each end, and the same message for an end that is none."""
    query, texts = "the film", ["the food " * 300 + TINY_TEXTS[0], TINY_TEXTS[1]]
    scores = {}
    for direction in ("Left", "Right"):
        value = {"query": query, "texts": texts, "truncation_direction": direction}
        top = http.post("/rerank", json={**value, "model": "tei-rerank"})
        assert top.status_code == 200, top.text
        assert top.json() == http.post("/tei/tei-rerank/rerank", json=value).json()
        scores[direction] = {r["index"]: r["score"] for r in top.json()}
    # Cut at the left the long text keeps its end, at the right its start: two texts.
    assert scores["Left"][0] != scores["Right"][0]
    assert scores["Left"][1] == pytest.approx(scores["Right"][1], abs=1e-6)
    bad = {"query": query, "texts": texts, "truncation_direction": "Middle"}
    refused = http.post("/rerank", json={**bad, "model": "tei-rerank"})
    tei_refused = http.post("/tei/tei-rerank/rerank", json=bad)
    assert refused.status_code == tei_refused.status_code == 422
    assert refused.json()["error"] == tei_refused.json()["error"]
    assert "is not one of TEI's ends" in refused.json()["error"]


def test_embed_all_is_refused_with_teis_424_saying_why(http):
    refused = http.post("/tei/embed/embed_all", json={"inputs": "What is Deep Learning?"})
    assert refused.status_code == 424
    assert refused.json()["error_type"] == "backend"
    assert "pools the tokens inside (mean pooling)" in refused.json()["error"]


def test_health_and_metrics_under_the_base_url(http):
    health = http.get("/tei/embed/health")
    assert health.status_code == 200 and health.content == b""
    assert http.get("/tei/no-such-model/health").status_code == 404
    for _ in range(3):
        assert http.post("/tei/embed/embed", json={"inputs": "counted"}).status_code == 200

    def requests_counted() -> list[str]:
        reply = http.get("/tei/embed/metrics")
        assert reply.status_code == 200, reply.text
        assert reply.headers["content-type"].startswith("text/plain")
        lines = [line for line in reply.text.splitlines() if not line.startswith("#")]
        counted = [line for line in lines if line.startswith("infergate_requests_total{")]
        return lines if counted else []

    # The replicas hand Ray their totals each second and Prometheus scrapes every 5 s.
    lines = wait_for(requests_counted, 60, "the model's requests in /tei/embed/metrics", 1.0)
    assert all('model="embed"' in line for line in lines), lines[:5]
    assert any(line.startswith("infergate_request_duration_seconds_bucket{") for line in lines)


def test_v2_takes_a_prompt_name_over_rest_and_grpc(stack, http):
    tensor = {"name": "text", "shape": [len(TINY_TEXTS)], "datatype": "BYTES",
              "data": TINY_TEXTS}  # fmt: skip
    body = {"inputs": [tensor], "parameters": {"prompt_name": "title"}}
    reply = http.post(f"/v2/models/{PROMPTED}/infer", json=body)
    assert reply.status_code == 200, reply.text
    (output,) = reply.json()["outputs"]
    expected = embed(http, TINY_TEXTS, "title")
    np.testing.assert_allclose(np.reshape(output["data"], output["shape"]), expected, atol=1e-6)
    text = triton_grpc.InferInput("text", [len(TINY_TEXTS)], "BYTES")
    text.set_data_from_numpy(np.array(TINY_TEXTS, dtype=object))
    url = f"127.0.0.1:{stack.env['INFERGATE_FRONTEND__GRPC_PORT']}"
    with triton_grpc.InferenceServerClient(url=url) as client:
        result = client.infer(PROMPTED, [text], parameters={"prompt_name": "title"})
        np.testing.assert_allclose(result.as_numpy("embedding"), expected, atol=1e-6)
        with pytest.raises(InferenceServerException, match="no prompt called 'nope'"):
            client.infer(PROMPTED, [text], parameters={"prompt_name": "nope"})
    unknown = {"inputs": [tensor], "parameters": {"prompt_name": "nope"}}
    assert http.post(f"/v2/models/{PROMPTED}/infer", json=unknown).status_code == 422
