"""Text Embeddings Inference's API, the parts beyond its main routes: which end of a long
text is cut (``truncation_direction``), text pairs on ``/predict``, ``/embed_all``
(refused: no served graph gives token vectors out), ``/health`` and ``/metrics`` under a
model's base URL; and ``prompt_name`` on the Open Inference Protocol. Through a real
``Frontend`` whose Triton is a fake (``test_tei.fake_outputs``: a text's answer depends on
its tokens alone), with the real MiniLM tokenizer cutting texts at 16 tokens.

huggingface_hub's InferenceClient against the whole stack: tests/e2e/test_tei_client.py.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from starlette.testclient import TestClient
from test_tei import LIMITS, MINILM, MODELS, TEXTS, body, fake_outputs, native, runtime

from fakes import FakeTritonBackend, Recorder, asgi
from infergate.config import FrontendSettings
from infergate.errors import BackendUnavailable, InvalidInput
from infergate.protocols import tei
from infergate.protocols.frontend import Frontend, openapi_document
from infergate.protocols.rerank import rerank_parser
from infergate.protocols.tei_metrics import model_metrics, selector
from infergate.serving.routing import ServedModel
from infergate.serving.tokenization import TextTokenizer, split_direction

FILLER = "hello " * 30  # far past the 14 text tokens a 16-token model takes
TAIL = "the quick brown fox jumps over the lazy dog"  # 9 tokens


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer.from_dir(MINILM, max_length=16)


def frontend(tokenizer, backend=None, telemetry=None, **settings) -> Frontend:
    models = {
        name: ServedModel(name, task, (runtime(tokenizer, name, task, **spec),))
        for name, (task, spec) in MODELS.items()
    }
    return Frontend(
        FrontendSettings(max_texts_per_request=4, **settings),
        backend or FakeTritonBackend(outputs=fake_outputs), models,
        telemetry=telemetry, monitors=telemetry,
    )  # fmt: skip


@pytest.fixture()
def client(tokenizer) -> TestClient:
    return TestClient(asgi(frontend(tokenizer)))


def post(client: TestClient, path: str, value) -> list:
    reply = client.post(path, json=value)
    assert reply.status_code == 200, reply.text
    return reply.json()


# -- truncation_direction -------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["Left", "left"])
def test_left_is_passed_on_and_right_is_the_default(spelling):
    for parse, value in [
        (tei.parse_embed, {"inputs": "a"}),
        (tei.parse_sparse, {"inputs": "a"}),
        (tei.parse_predict, {"inputs": "a"}),
        (tei.parse_rerank, {"query": "q", "texts": ["a"]}),
        (tei.parse_embed_all, {"inputs": "a"}),
    ]:
        left = parse(body({**value, "truncation_direction": spelling}), LIMITS)
        assert left.parameters["truncation_direction"] == "left", parse
        right = parse(body({**value, "truncation_direction": "Right"}), LIMITS)
        assert "truncation_direction" not in right.parameters, parse
    similar = {"inputs": {"source_sentence": "a", "sentences": ["b"]},
               "parameters": {"truncation_direction": spelling}}  # fmt: skip
    assert tei.parse_similarity(body(similar), LIMITS).parameters == {
        "truncation_direction": "left"
    }


def test_left_truncation_keeps_the_end_of_a_long_text(client):
    # 14 text tokens fit: the last five "hello"s and the tail's nine, or the first 14.
    kept_end = np.array(native(client, "embed", ["hello " * 5 + TAIL]))
    kept_start = np.array(native(client, "embed", ["hello " * 14]))
    for direction, expected in [("Left", kept_end), ("Right", kept_start), (None, kept_start)]:
        value = {"inputs": [FILLER + TAIL, "short"], "truncation_direction": direction}
        vectors = np.array(post(client, "/tei/embed/embed", value))
        np.testing.assert_array_equal(vectors[:1], expected)
        np.testing.assert_array_equal(vectors[1:], native(client, "embed", ["short"]))
    assert not np.allclose(kept_end, kept_start)


def test_left_truncation_on_every_route_that_cuts(client):
    long, cut = FILLER + TAIL, "hello " * 5 + TAIL
    left = {"truncation_direction": "Left"}
    sparse = post(client, "/tei/splade/embed_sparse", {"inputs": long, **left})
    assert sparse == post(client, "/tei/splade/embed_sparse", {"inputs": cut})
    labels = post(client, "/tei/sentiment/predict", {"inputs": long, **left})
    assert labels == post(client, "/tei/sentiment/predict", {"inputs": cut})
    assert labels != post(client, "/tei/sentiment/predict", {"inputs": long})
    # A pair is cut longest first: the long text loses its start, the query stays whole.
    ranked = post(client, "/tei/rerank/rerank", {"query": "q", "texts": [long], **left})
    query_cut = "hello " * 3 + TAIL  # [CLS] q [SEP] ... [SEP]: 12 of the text's tokens
    same = post(client, "/tei/rerank/rerank", {"query": "q", "texts": [query_cut]})
    assert ranked == same
    # Cut or not, "truncate": false still refuses a text too long, as TEI does.
    refused = client.post("/tei/embed/embed", json={"inputs": long, "truncate": False, **left})
    assert refused.status_code == 413 and refused.json()["error_type"] == "validation"


def test_the_top_level_rerank_cuts_the_end_tei_s_route_cuts(client):
    """``POST /rerank`` (the model in the body) takes ``truncation_direction`` as the
    model's TEI route does: the same answers for each end, the same refusals."""
    long = FILLER + TAIL
    for direction in ("Left", "left", "Right", None):
        value = {"query": "q", "texts": [long, "short"], "truncation_direction": direction}
        top = post(client, "/rerank", {**value, "model": "rerank"})
        assert top == post(client, "/tei/rerank/rerank", value), direction
    left = post(client, "/rerank", {"model": "rerank", "query": "q", "texts": [long],
                                    "truncation_direction": "Left"})  # fmt: skip
    query_cut = "hello " * 3 + TAIL  # as test_left_truncation_on_every_route_that_cuts
    assert left == post(client, "/rerank", {"model": "rerank", "query": "q", "texts": [query_cut]})
    assert left != post(client, "/rerank", {"model": "rerank", "query": "q", "texts": [long]})
    for bad in ("Middle", 0, ["Left"]):
        body = {"query": "q", "texts": ["a"], "truncation_direction": bad}
        refused = client.post("/rerank", json={**body, "model": "rerank"})
        tei_refused = client.post("/tei/rerank/rerank", json=body)
        assert refused.status_code == tei_refused.status_code == 422, bad
        # The message is the TEI route's; the body the native one's (TEI's on /tei/...).
        assert refused.json() == {"error": tei_refused.json()["error"], "type": "invalid_input"}
    middle = client.post("/rerank", json={"model": "rerank", "query": "q", "texts": ["a"],
                                          "truncation_direction": "Middle"})  # fmt: skip
    assert middle.json()["error"] == (
        "'truncation_direction' 'Middle' is not one of TEI's ends; send 'Right' (the default: "
        "a long text's start is kept) or 'Left' (its end is kept)"
    )


def test_the_top_level_rerank_parser_passes_left_on_and_leaves_right_out():
    parse = rerank_parser(True)
    value = {"model": "rerank", "query": "q", "texts": ["a"]}
    left = parse(body({**value, "truncation_direction": "Left"}), LIMITS)
    assert left.parameters == {"query": "q", "truncation_direction": "left"}
    for right in ({**value, "truncation_direction": "right"}, value):
        assert parse(body(right), LIMITS).parameters == {"query": "q"}
    # The model's own route (/v1/models/{name}/rerank) keeps its body: the field is unknown.
    with pytest.raises(InvalidInput, match="truncation_direction"):
        rerank_parser(False)(body({"query": "q", "texts": ["a"], "truncation_direction": "Left"}),
                             LIMITS)  # fmt: skip


def test_a_left_request_leaves_other_requests_cut_at_the_right(tokenizer):
    """The version's tokenizer is shared; requests of both ends interleaved on one event
    loop (as a replica runs them) each get their own end."""
    app = asgi(frontend(tokenizer))
    kept_start = None

    async def run() -> list[tuple[str, list]]:
        nonlocal kept_start
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:

            async def one(direction: str) -> tuple[str, list]:
                value = {"inputs": FILLER + TAIL, "truncation_direction": direction}
                reply = await http.post("/tei/embed/embed", json=value)
                return direction, reply.json()

            start = await http.post("/v1/models/embed/predict", json={"inputs": "hello " * 14})
            kept_start = start.json()["outputs"]
            return await asyncio.gather(*(one(d) for d in ["Left", "Right"] * 10))

    answers = asyncio.run(run())
    lefts = {str(a) for d, a in answers if d == "Left"}
    rights = [a for d, a in answers if d == "Right"]
    assert len(lefts) == 1 and lefts != {str(rights[0])}
    for answer in rights:
        np.testing.assert_array_equal(answer, kept_start)


# -- text pairs on /predict -----------------------------------------------------------------


def test_pairs_on_predict_are_a_cross_encoders_relevance(client):
    pairs = [["q", "a"], ["another query", "b c"]]
    answers = post(client, "/tei/rerank/predict", {"inputs": pairs})
    for (query, text), labels in zip(pairs, answers, strict=True):
        (expected,) = native(client, "rerank", [text], query=query)
        assert labels == [{"label": "score", "score": expected["score"]}]
    one = post(client, "/tei/rerank/predict", {"inputs": ["q", "a"]})
    assert one == answers[0]
    raw = post(client, "/tei/rerank/predict", {"inputs": [["q", "a"]], "raw_scores": True})
    (logit,) = native(client, "rerank", ["a"], query="q", raw_scores=True)
    assert raw == [[{"label": "score", "score": logit["score"]}]]
    # The root of a text-ranking model takes TEI's rerank body, as before.
    assert client.post("/tei/rerank", json={"inputs": pairs}).status_code == 422


def test_one_text_in_a_list_is_one_text(client):
    assert post(client, "/tei/sentiment/predict", {"inputs": ["I like you."]}) == post(
        client, "/tei/sentiment/predict", {"inputs": "I like you."}
    )


def test_pairs_to_a_classifier_and_texts_to_a_cross_encoder_are_refused(client):
    for value in ({"inputs": ["a", "b"]}, {"inputs": [["a", "b"], ["c", "d"]]}):
        refused = client.post("/tei/sentiment/predict", json=value)
        assert refused.status_code == 422, refused.text
        assert refused.json() == {
            "error": "model 'sentiment' is a text-classification model, which reads one text; "
            "text pairs need a text-ranking model (a cross-encoder); send one text, or a "
            'batch of one-text lists: [["t1"], ["t2"]]',
            "error_type": "validation",
        }
    single = client.post("/tei/rerank/predict", json={"inputs": "a"})
    assert single.status_code == 424 and "text-classification" in single.json()["error"]
    embedder = client.post("/tei/embed/predict", json={"inputs": [["a", "b"]]})
    assert embedder.status_code == 422 and "reads one text" in embedder.json()["error"]


# -- /embed_all ------------------------------------------------------------------------------


def test_embed_all_is_refused_after_the_body_and_model_are_checked(client):
    refused = client.post("/tei/embed/embed_all", json={"inputs": TEXTS})
    assert refused.status_code == 424
    assert refused.json() == {
        "error": "model 'embed' cannot answer /embed_all: its served graph pools the tokens "
        "inside (mean pooling), so per-token embeddings are not among its outputs; /embed "
        "answers the pooled vector",
        "error_type": "backend",
    }
    other = client.post("/tei/sentiment/embed_all", json={"inputs": "a"})
    assert other.status_code == 424 and "answers no embeddings" in other.json()["error"]
    assert client.post("/tei/embed/embed_all", json={"inputs": 3}).status_code == 422
    bad_end = client.post("/tei/embed/embed_all", json={"inputs": "a", "truncation_direction": 0})
    assert bad_end.status_code == 422
    assert client.post("/tei/nope/embed_all", json={"inputs": "a"}).status_code == 404


# -- /health and /metrics -------------------------------------------------------------------


def test_health_is_200_while_the_model_answers_and_503_when_not(tokenizer, client):
    healthy = client.get("/tei/embed/health")
    assert healthy.status_code == 200 and healthy.content == b""
    down = TestClient(asgi(frontend(
        tokenizer, FakeTritonBackend(error=BackendUnavailable("Triton is away"))
    )))  # fmt: skip
    unhealthy = down.get("/tei/embed/health")
    assert unhealthy.status_code == 503
    assert unhealthy.json() == {
        "error": "model 'embed' is not ready: version(s) ['1']",
        "error_type": "unhealthy",
    }
    assert client.get("/tei/nope/health").status_code == 404


def test_metrics_without_a_prometheus_is_a_404_saying_what_to_set(client):
    reply = client.get("/tei/embed/metrics")
    assert reply.status_code == 404
    assert "frontend.metrics_federate_url is unset" in reply.json()["error"]
    assert client.get("/tei/nope/metrics").status_code == 404


def test_metrics_are_the_models_series_federated_by_prometheus():
    exposition = 'infergate_requests_total{model="embed",status="200"} 3\n'
    asked: list[httpx.Request] = []

    def prometheus(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(200, text=exposition)

    text = asyncio.run(model_metrics(
        "http://prom:9090/federate", "embed", 1.0, httpx.MockTransport(prometheus)
    ))  # fmt: skip
    assert text == exposition
    assert asked[0].url.params.get_list("match[]") == [selector("embed")]
    assert selector('a"b') == '{__name__=~"infergate_.+",model="a\\"b"}'

    def away(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    for transport in (
        httpx.MockTransport(away),
        httpx.MockTransport(lambda r: httpx.Response(500)),
    ):
        with pytest.raises(BackendUnavailable, match="Prometheus"):
            asyncio.run(model_metrics("http://prom:9090/federate", "embed", 1.0, transport))


def test_the_new_routes_are_documented():
    paths = openapi_document()["paths"]
    assert "requestBody" in paths["/tei/{name}/embed_all"]["post"]
    assert {"200", "503"} <= set(paths["/tei/{name}/health"]["get"]["responses"])
    assert "text/plain" in paths["/tei/{name}/metrics"]["get"]["responses"]["200"]["content"]


# -- prompt_name on the Open Inference Protocol ----------------------------------------------


def v2_body(texts: list[str], **parameters) -> dict:
    tensor = {"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}
    return {"inputs": [tensor], **({"parameters": parameters} if parameters else {})}


def test_v2_takes_a_prompt_name_and_counts_its_tokens(tokenizer):
    recorder = Recorder()
    client = TestClient(asgi(frontend(tokenizer, telemetry=recorder)))
    plain = native(client, "embed", [f"passage: {t}" for t in TEXTS])
    reply = client.post("/v2/models/prompted/infer", json=v2_body(TEXTS, prompt_name="passage"))
    assert reply.status_code == 200, reply.text
    (output,) = reply.json()["outputs"]
    np.testing.assert_allclose(np.reshape(output["data"], output["shape"]), plain, rtol=1e-6)
    # Without one, the model's default prompt ("query: ").
    default = client.post("/v2/models/prompted/infer", json=v2_body(TEXTS)).json()["outputs"][0]
    queried = native(client, "embed", [f"query: {t}" for t in TEXTS])
    np.testing.assert_allclose(np.reshape(default["data"], default["shape"]), queried, rtol=1e-6)
    # The tokens counted (infergate_input_tokens) are the prompted texts': 2 more each.
    bare = client.post("/v2/models/embed/infer", json=v2_body(TEXTS))
    assert bare.status_code == 200
    v2_lengths = recorder.predictions[1].batch.lengths
    assert recorder.predictions[-1].batch.lengths.tolist() == (v2_lengths - 2).tolist()


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"prompt_name": "doc"}, "no prompt called 'doc'; its prompts are 'passage', 'query'"),
        ({"prompt_name": 3}, "parameter 'prompt_name' must be str, got a number"),
    ],
)
def test_v2_refuses_a_bad_prompt_name(client, parameters, message):
    reply = client.post("/v2/models/prompted/infer", json=v2_body(["a"], **parameters))
    assert reply.status_code == 422 and message in reply.json()["error"]


def test_the_v2_request_schema_documents_prompt_name():
    schema = openapi_document()["components"]["schemas"]["V2InferRequest"]
    assert "prompt_name" in schema["properties"]["parameters"]["description"]


def test_a_direction_of_neither_end_is_refused_by_the_runtime():
    with pytest.raises(InvalidInput, match="not one of"):
        split_direction({"truncation_direction": "middle"})
