"""text-ranking end to end in process: a tiny cross-encoder exported as registration does,
served by the front-end's own path (its ONNX file in place of Triton), against the same
files run by transformers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from infergate import tasks
from infergate.errors import RegistrationError
from infergate.observe.drift import DriftWindow
from infergate.registration import onnx_export
from served_locally import serve_locally
from tiny_models import tiny_bert

QUERY = "is the film good"
TEXTS = ["i love this film", "the service was slow and the food bad", "quiet", "a good book"]


def transformers_scores(folder, query: str, texts: list[str]) -> np.ndarray:
    """What sentence-transformers' CrossEncoder computes: the tokenizer's own pair encoding
    (token type ids included), sigmoid of one logit or softmax's second column of two."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    enc = tokenizer([query] * len(texts), texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    if logits.shape[-1] == 1:
        return torch.sigmoid(logits[:, 0]).numpy()
    return torch.softmax(logits, dim=-1)[:, 1].numpy()


@pytest.fixture(scope="module", params=[("relevance",), ("irrelevant", "relevant")])
def local(request, tmp_path_factory):
    folder = tiny_bert(tmp_path_factory.mktemp("ce") / "m", "text-ranking", labels=request.param)
    served = serve_locally(folder, "text-ranking", tmp_path_factory.mktemp("out"), name="rr")
    served.folder = folder  # type: ignore[attr-defined]
    return served


def test_export_checks_parity_on_the_relevance_score(local):
    built = local.built
    assert (built.output_name, built.labels) == ("scores", [])
    assert built.output_dim in (1, 2)
    assert built.parity.passed and built.parity.extra["rank_agreement"] == 1.0


def test_rerank_equals_transformers_on_the_same_files_best_first(local):
    expected = transformers_scores(local.folder, QUERY, TEXTS)
    body = {"query": QUERY, "texts": TEXTS, "return_text": True}
    reply = local.client.post("/v1/models/rr/rerank", json=body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert (answer["model"], answer["version"]) == ("rr", "1")
    results = answer["results"]
    assert [r["index"] for r in results] == list(np.argsort(-expected, kind="stable"))
    for result in results:
        assert result["score"] == pytest.approx(float(expected[result["index"]]), abs=1e-5)
        assert result["text"] == TEXTS[result["index"]]
    assert float(local.frontend.models["rr"].versions[0].served.weight) == 100
    assert local.backend.calls >= 1


def test_top_n_tei_shape_and_predict_in_input_order(local):
    expected = transformers_scores(local.folder, QUERY, TEXTS)
    tei = local.client.post("/rerank", json={"query": QUERY, "texts": TEXTS, "top_n": 2})
    assert tei.status_code == 200, tei.text
    assert [r["index"] for r in tei.json()] == list(np.argsort(-expected, kind="stable")[:2])
    assert all("text" not in r for r in tei.json())
    predict = local.client.post(
        "/v1/models/rr/predict", json={"inputs": TEXTS, "parameters": {"query": QUERY}}
    )
    assert predict.status_code == 200, predict.text
    scores = [o["score"] for o in predict.json()["outputs"]]
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    raw = local.client.post("/rerank", json={"query": QUERY, "texts": TEXTS, "raw_scores": True})
    log_odds = {r["index"]: r["score"] for r in raw.json()}
    np.testing.assert_allclose(
        [1 / (1 + np.exp(-log_odds[i])) for i in range(len(TEXTS))], expected, atol=1e-5
    )


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/v1/models/rr/rerank", {"texts": ["a"]}, 422, "'query' is missing"),
        ("/v1/models/rr/rerank", {"query": " ", "texts": ["a"]}, 422, "'query' is empty"),
        ("/v1/models/rr/rerank", {"query": "q", "texts": "a"}, 422, "list of strings"),
        ("/v1/models/rr/rerank", {"query": "q", "texts": []}, 422, "empty list"),
        ("/v1/models/rr/rerank", {"query": "q", "texts": ["a"], "top_n": 0}, 422, "top_n"),
        ("/v1/models/rr/rerank", {"query": "q", "texts": ["a"], "model": "rr"}, 422, "unknown"),
        ("/rerank", {"query": "q", "texts": ["a"], "model": "nope"}, 404, "not served"),
        ("/v1/models/rr/predict", {"inputs": ["a"]}, 422, "against a query"),
        ("/v1/models/rr/predict", {"inputs": ["a"], "parameters": {"normalize": True}}, 422,
         "applies to feature-extraction models"),
        ("/v2/models/rr/infer",
         {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]},
         422, "/v1/models/{name}/rerank"),
    ],
)  # fmt: skip
def test_bad_rerank_requests_are_refused_clearly(local, path, body, status, fragment):
    reply = local.client.post(path, json=body)
    assert reply.status_code == status, reply.text
    assert fragment in reply.json()["error"]


def test_statistics_drift_and_canary_counters_follow_the_scores(local):
    reference = local.reference
    assert sum(reference["relevance_score"]["counts"]) == 100
    assert 0.0 < reference["relevance_score_mean"] < 1.0
    for _ in range(20):
        reply = local.client.post("/v1/models/rr/rerank", json={"query": QUERY, "texts": TEXTS})
        assert reply.status_code == 200
    window = local.frontend.monitors.windows[("rr", "1")]
    assert {"relevance_score", "token_length"} <= {f for f, _ in window.scores()}
    counters = local.frontend.monitors.counters["rr/1"]
    shares = counters.window().output_shares
    assert counters.requests >= 20 and sum(shares) == pytest.approx(1.0)
    assert len(shares) == len(tasks.get("text-ranking").value_metric.buckets) + 1


def test_a_drift_window_scores_shifted_relevance(local):
    window = DriftWindow(local.reference, "text-ranking", min_texts=10)
    scores = np.full((200, 1), 0.999)
    window.add(np.full(200, 12), np.zeros(200), scores)
    assert window.scores()[("relevance_score", "psi")] > 0.25


def test_a_cross_encoder_needs_one_or_two_outputs(tmp_path):
    folder = tiny_bert(tmp_path / "m", "text-ranking", labels=("a", "b", "c"))
    with pytest.raises(RegistrationError, match=r"1 output .* or 2 .* this one has 3"):
        onnx_export.build(folder, "text-ranking", "fp32", tmp_path / "out", progress=False)
