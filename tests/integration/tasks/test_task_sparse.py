"""sparse-embedding (SPLADE) end to end in process: a tiny masked-LM exported as
registration does (pooling in the graph), served by the front-end's own path, against
SPLADE computed by transformers on the same files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from infergate.errors import RegistrationError
from infergate.observe.drift import DriftWindow
from infergate.registration import onnx_export
from infergate.tasks.sparse import sparse_terms
from served_locally import serve_locally
from tiny_models import tiny_bert

TEXTS = ["i love this film", "the service was slow and the food bad", "quiet"]


def splade(folder, texts: list[str]) -> np.ndarray:
    """SPLADE by the definition: max over the unpadded tokens of log(1 + relu(logits))."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    weights = torch.log1p(torch.relu(logits)) * enc["attention_mask"].unsqueeze(-1)
    return weights.max(dim=1).values.numpy()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    folder = tiny_bert(tmp_path_factory.mktemp("splade") / "m", "sparse-embedding")
    served = serve_locally(folder, "sparse-embedding", tmp_path_factory.mktemp("out"), "sp")
    served.folder = folder  # type: ignore[attr-defined]
    return served


def test_the_graph_pools_to_one_vocabulary_row_per_text(local):
    built = local.built
    assert (built.output_name, built.labels, built.parity.passed) == ("term_weights", [], True)
    vocabulary = transformers.AutoConfig.from_pretrained(local.folder).vocab_size
    assert built.output_dim == vocabulary


def test_served_terms_equal_splade_by_transformers(local):
    expected = splade(local.folder, TEXTS)
    reply = local.client.post("/v1/models/sp/predict", json={"inputs": TEXTS})
    assert reply.status_code == 200, reply.text
    for row, output in zip(expected, reply.json()["outputs"], strict=True):
        # The same terms, up to float rounding of weights at the edge of 0.
        clear = set(np.flatnonzero(row > 1e-4).tolist())
        assert clear <= set(output["indices"]) <= set(np.flatnonzero(row > 0).tolist()) | clear
        dense = np.zeros_like(row)
        dense[output["indices"]] = output["values"]
        np.testing.assert_allclose(dense, row, atol=1e-4)
        assert output["values"] == sorted(output["values"], reverse=True)


def test_top_k_keeps_the_heaviest_terms(local):
    full = local.client.post("/v1/models/sp/predict", json={"inputs": TEXTS[:1]}).json()
    top = local.client.post(
        "/v1/models/sp/predict", json={"inputs": TEXTS[:1], "parameters": {"top_k": 3}}
    ).json()
    assert top["outputs"][0]["indices"] == full["outputs"][0]["indices"][:3]
    for bad in (0, True, "3"):
        reply = local.client.post(
            "/v1/models/sp/predict", json={"inputs": "a", "parameters": {"top_k": bad}}
        )
        assert reply.status_code == 422, reply.text


def test_sparse_terms_orders_by_weight_then_index():
    row = np.array([0.0, 0.5, 0.0, 2.0, 0.5])
    assert sparse_terms(row) == {"indices": [3, 1, 4], "values": [2.0, 0.5, 0.5]}
    assert sparse_terms(row, 1) == {"indices": [3], "values": [2.0]}
    assert sparse_terms(np.zeros(4)) == {"indices": [], "values": []}


def test_other_endpoints_refuse_a_sparse_model(local):
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}
    v2 = local.client.post("/v2/models/sp/infer", json={"inputs": [tensor]})
    assert v2.status_code == 422 and "/v1/models/{name}/predict" in v2.json()["error"]
    rerank = local.client.post("/rerank", json={"query": "q", "texts": ["a"], "model": "sp"})
    assert rerank.status_code == 422 and "ranks nothing" in rerank.json()["error"]
    query = local.client.post(
        "/v1/models/sp/predict", json={"inputs": "a", "parameters": {"query": "q"}}
    )
    assert query.status_code == 422 and "applies to text-ranking models" in query.json()["error"]


def test_statistics_drift_and_canary_counters_count_the_terms(local):
    reference = local.reference
    assert sum(reference["nonzero_terms"]["counts"]) == 100
    assert reference["nonzero_terms_mean"] > 0
    for _ in range(20):
        assert local.client.post("/v1/models/sp/predict", json={"inputs": TEXTS}).status_code == 200
    window = local.frontend.monitors.windows[("sp", "1")]
    assert ("nonzero_terms", "psi") in window.scores()
    shares = local.frontend.monitors.counters["sp/1"].window().output_shares
    assert sum(shares) == pytest.approx(1.0)
    shifted = DriftWindow(reference, "sparse-embedding", min_texts=10)
    weights = np.zeros((100, local.built.output_dim))
    weights[:, :2] = 1.0  # two terms a text: far fewer than the reference
    shifted.add(np.full(100, 10), np.zeros(100), weights)
    assert shifted.scores()[("nonzero_terms", "psi")] > 0.25


def test_an_encoder_without_its_mlm_head_is_refused(tmp_path):
    folder = tiny_bert(tmp_path / "m", "feature-extraction")
    with pytest.raises(RegistrationError, match="no trained sparse-embedding head"):
        onnx_export.build(folder, "sparse-embedding", "fp32", tmp_path / "out", progress=False)
