"""``register_model`` in process, for an engine each: a tiny classifier exported to ONNX
and a tiny Marian converted by CTranslate2 become versions holding the same files (spec,
reference statistics, parity report, Triton config) and the run's metrics, params and
tags their engine measures. The registry is ``MemoryRegistry``; tests/e2e register into
MLflow through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakes import MemoryRegistry
from infergate.errors import RegistrationError
from infergate.registration.pipeline import describe, register_model
from infergate.registration.reference_texts import DEFAULT_REFERENCE_TEXTS
from infergate.versions import PARITY_FILE, QUALITY_FILE, REFERENCE_FILE, SPEC_FILE
from tiny_models import tiny_bert, tiny_marian

SHARED_FILES = {SPEC_FILE, REFERENCE_FILE, PARITY_FILE, "triton", "tokenizer"}


@pytest.fixture
def texts(tmp_path: Path) -> Path:
    """The first 40 of the default reference texts."""
    lines = DEFAULT_REFERENCE_TEXTS.read_text().splitlines()[:41]  # and the header
    path = tmp_path / "texts.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_onnx_model_is_a_version_with_its_files_and_figures(tmp_path, texts):
    registry = MemoryRegistry(files=tmp_path / "registry")
    folder = tiny_bert(tmp_path / "tiny", "text-classification", labels=("sad", "happy"))
    registered = register_model(
        str(folder), name="tiny", task="text-classification", registry=registry,
        precision="fp32", reference_texts=texts, alias="champion", progress=False,
    )  # fmt: skip
    assert (registered.name, registered.version, registered.task) == (
        "tiny", "1", "text-classification"
    )  # fmt: skip
    assert registered.precision == "fp32" and registered.parity_check.startswith("max_abs_diff")
    assert registered.quality.startswith("fp32")
    assert registry.model("tiny").aliases == {"champion": "1"}
    version = registry.registered["tiny", "1"]
    files = version["files"]
    assert {p.name for p in files.iterdir()} == SHARED_FILES | {QUALITY_FILE, "model.onnx"}
    assert registered.onnx_bytes == (files / "model.onnx").stat().st_size
    assert json.loads((files / SPEC_FILE).read_text()) == {
        "format": 1, "task": "text-classification", "labels": ["sad", "happy"],
        "output_name": "logits", "output_dim": 2, "max_length": 64, "precision": "fp32",
        "model_type": "bert", "source": str(folder), "source_format": "pytorch",
    }  # fmt: skip
    assert json.loads((files / REFERENCE_FILE).read_text())["n_texts"] == 40
    assert json.loads((files / PARITY_FILE).read_text())["passed"] is True
    assert "tiny__v1" in (files / "triton" / "config.pbtxt").read_text()
    assert set(version["metrics"]) == {
        "parity_max_abs_diff", "parity_tolerance", "parity_max_abs_diff_softmax",
        "parity_argmax_agreement", "quality_label_agreement",
        "quality_probability_max_change", "quality_probability_mean_change",
        "reference_texts", "unknown_token_ratio_reference",
    }  # fmt: skip
    assert version["metrics"]["reference_texts"] == 40.0
    assert version["params"] == {
        "task": "text-classification", "precision": "fp32", "quantisation": "fp32",
        "quality_budget": version["params"]["quality_budget"], "max_length": "64",
        "model_type": "bert", "source": str(folder), "source_format": "pytorch",
    }  # fmt: skip
    assert set(version["tags"]) == {
        "infergate.precision", "infergate.quantisation", "infergate.parity_max_abs_diff",
        "infergate.parity_check", "infergate.parity_passed",
    }  # fmt: skip
    assert version["tags"]["infergate.parity_passed"] == "true"
    assert "ONNX, parity max_abs_diff" in describe(registered)


def test_a_translation_model_is_a_version_with_its_files_and_figures(tmp_path, texts):
    registry = MemoryRegistry(files=tmp_path / "registry")
    folder = tiny_marian(tmp_path / "marian")
    registered = register_model(
        str(folder), name="translate", task="translation", registry=registry,
        precision="fp32", reference_texts=texts, progress=False,
    )  # fmt: skip
    assert (registered.name, registered.version, registered.task) == (
        "translate", "1", "translation"
    )  # fmt: skip
    assert registered.parity_check.startswith("chrf 100 >= 99") and registered.quality == ""
    assert registry.model("translate").aliases == {}
    version = registry.registered["translate", "1"]
    files = version["files"]
    assert {p.name for p in files.iterdir()} == SHARED_FILES | {"ctranslate2"}
    assert registered.onnx_bytes == sum(p.stat().st_size for p in (files / "ctranslate2").iterdir())
    assert json.loads((files / SPEC_FILE).read_text()) == {
        "format": 1, "task": "translation", "labels": [], "output_name": "translation_ids",
        "output_dim": 1, "max_length": 64, "max_decoding_length": 63, "precision": "fp32",
        "model_type": "marian", "source": str(folder),
    }  # fmt: skip
    assert json.loads((files / REFERENCE_FILE).read_text())["n_texts"] == 40
    assert json.loads((files / PARITY_FILE).read_text())["passed"] is True
    assert "translate__v1" in (files / "triton" / "config.pbtxt").read_text()
    assert set(version["metrics"]) == {
        "parity_exact_match", "parity_chrf", "parity_min_chrf", "parity_texts",
        "reference_texts", "reference_output_tokens_mean", "unknown_token_ratio_reference",
    }  # fmt: skip
    assert version["metrics"]["parity_texts"] == version["metrics"]["reference_texts"] == 40.0
    assert version["params"] == {
        "task": "translation", "precision": "fp32", "engine": "ctranslate2",
        "compute_type_cpu": "float32", "max_length": "64", "model_type": "marian",
        "source": str(folder),
    }  # fmt: skip
    assert set(version["tags"]) == {
        "infergate.precision", "infergate.parity_check", "infergate.parity_passed",
    }  # fmt: skip
    assert "CTranslate2, parity chrf" in describe(registered)


def test_a_translation_model_takes_no_onnx_file_and_a_model_keeps_its_task(tmp_path, texts):
    registry = MemoryRegistry(files=tmp_path / "registry")
    with pytest.raises(RegistrationError, match="--onnx does not apply"):
        register_model(
            str(tmp_path), name="t", task="translation", registry=registry,
            onnx_file="model.onnx", reference_texts=texts, progress=False,
        )  # fmt: skip
    folder = tiny_bert(tmp_path / "tiny", "text-classification")
    register_model(
        str(folder), name="tiny", task="text-classification", registry=registry,
        precision="fp32", reference_texts=texts, progress=False,
    )  # fmt: skip
    with pytest.raises(RegistrationError, match="'tiny' is a text-classification model"):
        register_model(
            str(folder), name="tiny", task="translation", registry=registry,
            reference_texts=texts, progress=False,
        )  # fmt: skip
    assert list(registry.registered) == [("tiny", "1")]
