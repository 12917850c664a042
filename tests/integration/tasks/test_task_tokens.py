"""token-classification (NER) end to end in process: a tiny token classifier exported as
registration does, served by the front-end's own path, against transformers'
token-classification pipeline on the same files, for every aggregation strategy."""

from __future__ import annotations

import numpy as np
import pytest
import transformers

from infergate.observe.drift import DriftWindow
from infergate.tasks.tokens import STRATEGIES, entity_types, text_entities
from served_locally import serve_locally
from tiny_models import tiny_bert

LABELS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC", "MISC")
TEXTS = [
    "I love this filmy book",
    "The items were booked at the café, not at all quiet!",
    "  Quiet  service  ",
    "films and movies and books for you and that food",
]


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    folder = tiny_bert(tmp_path_factory.mktemp("ner") / "m", "token-classification",
                       labels=LABELS, seed=3)  # fmt: skip
    served = serve_locally(folder, "token-classification", tmp_path_factory.mktemp("out"), "ner")
    served.folder = folder  # type: ignore[attr-defined]
    return served


def pipeline_entities(folder, text: str, strategy: str) -> list[dict]:
    pipe = transformers.pipeline("token-classification", model=str(folder),
                                 aggregation_strategy=strategy)  # fmt: skip
    found = []
    for entity in pipe(text):
        kind = entity.get("entity_group", entity.get("entity"))
        found.append({"entity": kind, "score": float(entity["score"]), "start": entity["start"],
                      "end": entity["end"]})  # fmt: skip
    return found


def test_export_keeps_one_row_per_token(local):
    built = local.built
    assert (built.output_name, built.labels) == ("token_logits", list(LABELS))
    assert built.parity.passed and built.parity.extra["argmax_agreement"] == 1.0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_entities_equal_the_transformers_pipeline(local, strategy):
    body = {"inputs": TEXTS, "parameters": {"aggregation_strategy": strategy}}
    reply = local.client.post("/v1/models/ner/predict", json=body)
    assert reply.status_code == 200, reply.text
    outputs = reply.json()["outputs"]
    found = 0
    for text, served in zip(TEXTS, outputs, strict=True):
        expected = pipeline_entities(local.folder, text, strategy)
        assert len(served) == len(expected), (text, served, expected)
        for ours, theirs in zip(served, expected, strict=True):
            assert ours["word"] == text[ours["start"] : ours["end"]]
            assert (ours["entity"], ours["start"], ours["end"]) == (
                theirs["entity"], theirs["start"], theirs["end"],
            )  # fmt: skip
            assert ours["score"] == pytest.approx(theirs["score"], abs=1e-4)
        found += len(served)
    assert found > 3  # the random model does find entities, so the comparison means something


def test_the_default_is_simple_and_unknown_strategies_are_refused(local):
    simple = {"inputs": TEXTS, "parameters": {"aggregation_strategy": "simple"}}
    default = local.client.post("/v1/models/ner/predict", json={"inputs": TEXTS}).json()
    assert (
        default["outputs"]
        == local.client.post("/v1/models/ner/predict", json=simple).json()["outputs"]
    )
    bad = local.client.post(
        "/v1/models/ner/predict",
        json={"inputs": "a", "parameters": {"aggregation_strategy": "longest"}},
    )
    assert bad.status_code == 422 and "none, simple, first, max, average" in bad.json()["error"]


def test_grouping_follows_bio_tags():
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    # tokens: [CLS] ann marie lives paris [SEP]; I-PER after B-PER continues, B-LOC starts
    probabilities = np.eye(5)[[0, 1, 2, 0, 3, 0]] * 0.9 + 0.02
    offsets = np.array([[0, 0], [0, 3], [4, 9], [10, 15], [16, 21], [0, 0]])
    special = np.array([1, 0, 0, 0, 0, 1])
    words = [None, 0, 1, 2, 3, None]
    text = "ann marie lives paris"
    found = text_entities(probabilities, offsets, special, words, labels, "simple", text)
    assert [(e["entity"], e["word"]) for e in found] == [("PER", "ann marie"), ("LOC", "paris")]
    tokens = text_entities(probabilities, offsets, special, words, labels, "none", text)
    assert [(e["entity"], e["index"]) for e in tokens] == [("B-PER", 1), ("I-PER", 2),
                                                          ("B-LOC", 4)]  # fmt: skip
    assert entity_types(labels) == ("LOC", "PER")


def test_statistics_drift_and_canary_counters(local):
    reference = local.reference
    assert set(reference["entity_types"]) == {"LOC", "MISC", "PER"}
    assert sum(reference["entities_per_text"]["counts"]) == 100
    for _ in range(20):
        assert (
            local.client.post("/v1/models/ner/predict", json={"inputs": TEXTS}).status_code == 200
        )
    scores = local.frontend.monitors.windows[("ner", "1")].scores()
    assert {("entities_per_text", "psi"), ("entity_type", "psi")} <= set(scores)
    window = local.frontend.monitors.counters["ner/1"].window()
    assert window.classes == LABELS and sum(window.output_shares) == pytest.approx(1.0)
    # Traffic where every text holds one PER and nothing else drifts on both features.
    shifted = DriftWindow(reference, "token-classification", min_texts=10)
    from infergate.tasks import Figures

    per_text = np.tile([[0.0, 0.0, 1.0]], (100, 1))  # LOC, MISC, PER
    figures = Figures(np.ones(100), per_text, ("LOC", "MISC", "PER"))
    shifted.add(np.full(100, 10), np.zeros(100), np.zeros((100, 4, 6)), figures=figures)
    assert shifted.scores()[("entity_type", "psi")] > 0.25


def test_other_endpoints_refuse_a_token_classifier(local):
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}
    assert local.client.post("/v2/models/ner/infer", json={"inputs": [tensor]}).status_code == 422
    reply = local.client.post("/v1/models/ner/predict",
                              json={"inputs": "a", "parameters": {"top_k": 2}})  # fmt: skip
    assert reply.status_code == 422 and "applies to sparse-embedding" in reply.json()["error"]
